"""A teacher must read the student's tokens: refused in one line otherwise (onpolicy/loading.py)."""

import pytest

from rlhfkit.errors import ModelError
from rlhfkit.onpolicy.loading import check_teacher_vocabulary

from ..support.mistakes import tokenizer_of


def test_a_teacher_of_the_same_tokenizer_with_padded_embeddings_is_accepted():
    check_teacher_vocabulary(tokenizer_of(160), tokenizer_of(160), 192, "teacher/")


def test_a_teacher_of_another_vocabulary_is_refused_naming_both_sizes():
    with pytest.raises(ModelError, match=r"teacher=teacher/ has another tokenizer: 170 tokens against the student's "
                                         r"160, 1 of the student's tokens with another id or none"):
        check_teacher_vocabulary(tokenizer_of(160), tokenizer_of(170), 170, "teacher/")


def test_a_teacher_whose_embedding_is_smaller_than_its_tokenizer_is_refused():
    with pytest.raises(ModelError, match="has 150 embedding rows for the tokenizer's 160 tokens"):
        check_teacher_vocabulary(tokenizer_of(160), tokenizer_of(160), 150, "teacher/")


def test_a_teacher_that_ends_with_another_token_than_the_students_eos_is_named(tiny_model_dir, capsys):
    from rlhfkit.models import load_policy
    from rlhfkit.onpolicy.distillation import warn_if_never_ends

    teacher, tokenizer = load_policy(str(tiny_model_dir))
    warn_if_never_ends(teacher, tokenizer, "teacher/")
    assert capsys.readouterr().err == ""  # the student's own EOS: nothing to say
    teacher.generation_config.eos_token_id = [7, 9]
    warn_if_never_ends(teacher, tokenizer, "teacher/")
    err = capsys.readouterr().err
    assert err.startswith("rlhfkit: warning: teacher=teacher/ ends its answers with 7 (")
    assert "never the student's EOS" in err
