"""Template-collapse alarms: many responses sharing an opening or an ending, or ending in a question
to the reader (GRPO and RLOO TL;DR summaries that all end "... what should I do?")."""

import pytest

from rlhfkit.data.tldr import load_sft
from rlhfkit.eval import alarms
from rlhfkit.report.caveats import alarm_caveat

from ..support.data import data_file

QUESTIONS = ["What should I do?", "Any advice?", "What do I do?"]


def alarms_of(responses):
    return alarms.alarms(responses, ["a post"] * len(responses), None, [True] * len(responses))


def test_openings_and_endings_are_normalised_words():
    assert alarms.opening("My GF (24F) dumped me...") == "my gf 24f"
    assert alarms.ending("Dumped. What should I do?!") == "should i do"
    assert alarms.ending("Any advice?") == "any advice"  # shorter than 3 words: the whole response
    assert alarms.opening("?!") == ""
    assert alarms.ends_with_question('She asked "why me?"') and alarms.ends_with_question("(any advice?) ")
    assert not alarms.ends_with_question("Is it over? I think so.")
    assert alarms.most_common_share(["a b", "a b", "c d", ""]) == (0.5, "a b")  # the empty response shares nothing
    assert alarms.most_common_share(["", ""]) == (0.0, "")


def test_99_of_100_ending_in_the_same_question_fire_and_the_caveat_names_the_ending():
    responses = [f"Summary {i} says my landlord kept the deposit. What should I do?" for i in range(99)] + [
        "Summary 99 says it is over."
    ]
    result = alarms_of(responses)
    assert result["shared_ending_share"] == 99 / 100 and result["top_ending"] == "should i do"
    assert result["question_ending_share"] == 99 / 100
    assert result["shared_opening_share"] == 1 / 100  # "summary 0 says", "summary 1 says", ... all differ
    assert result["flags"] == ["shared_ending_share", "question_ending_share"]
    caveat = alarm_caveat("grpo", result)
    assert (
        'shared_ending_share 0.990 (ending "should i do")' in caveat
        and 'question_ending_share 0.990 (ending in "?")' in caveat
    )


def test_differently_worded_questions_share_no_ending_but_fire_as_question_endings():
    responses = [f"Summary {i} says my landlord kept the deposit. {QUESTIONS[i % 3]}" for i in range(99)] + [
        "Summary 99 says it is over."
    ]
    result = alarms_of(responses)
    # "should i do", "deposit any advice" and "do i do" end 33 each (the first seen is named): none reaches 0.4
    assert result["shared_ending_share"] == 33 / 100 and result["top_ending"] == "should i do"
    assert result["question_ending_share"] == 99 / 100
    assert result["flags"] == ["question_ending_share"]


def test_all_sharing_their_first_four_words_fire_naming_the_opening():
    responses = [f"The passage describes a person who lost job number {i}." for i in range(20)]
    result = alarms_of(responses)
    assert result["shared_opening_share"] == 1.0 and result["top_opening"] == "the passage describes"
    assert result["shared_ending_share"] == 1 / 20 and result["question_ending_share"] == 0.0
    assert result["flags"] == ["shared_opening_share"]
    assert 'shared_opening_share 1.000 (opening "the passage describes")' in alarm_caveat("rloo", result)


@pytest.mark.parametrize("count", [1, 4, 9])
def test_too_few_responses_never_fire_though_their_shares_are_reported(count):
    result = alarms_of(["Dumped by text. What should I do?"] * count)
    assert result["shared_opening_share"] == result["shared_ending_share"] == result["question_ending_share"] == 1.0
    assert result["flags"] == []
    assert alarms_of(["Dumped by text. What should I do?"] * alarms.MIN_TEMPLATE_RESPONSES)["flags"] == list(
        alarms.TEMPLATE_ALARMS
    )


def test_real_reference_summaries_stay_silent():
    records, _ = load_sft([str(data_file("tldr-sft-sample", "tldr_sft_sample.jsonl.gz"))])
    references = [r.summary.strip() for r in records]
    result = alarms.alarms(references, [r.fields["post"] for r in records], references, [True] * len(references))
    assert len(references) == 1944  # one of the 1,945 posts is empty and skipped
    assert result["shared_opening_share"] == pytest.approx(22 / 1944) and result["top_opening"] == "how do i"
    assert result["shared_ending_share"] == pytest.approx(49 / 1944) and result["top_ending"] == "what to do"
    assert result["question_ending_share"] == pytest.approx(716 / 1944)  # a third of the humans ask a question
    assert result["flags"] == []
    first_hundred = alarms.template_collapse(references[:100])  # the size of an `rlhfkit eval` run
    assert (
        first_hundred["shared_opening_share"],
        first_hundred["shared_ending_share"],
        first_hundred["question_ending_share"],
    ) == (0.03, 0.03, 0.41)


def test_the_on_policy_report_reads_the_alarms_of_each_policys_held_out_samples():
    from rlhfkit.onpolicy.evaluation import held_out_alarms

    rows = [
        {
            "post": f"post {i} about my landlord",
            "reference": f"landlord issue {i}",
            "sft": f"{['rent', 'deposit', 'lease', 'repairs'][i % 4]} trouble {i}",
            "grpo": f"landlord story {i}. What should I do?",
            "sft_has_eos": True,
            "grpo_has_eos": True,
        }
        for i in range(12)
    ]
    assert held_out_alarms(rows, "sft")["flags"] == []
    trained = held_out_alarms(rows, "grpo")
    assert {"shared_ending_share", "question_ending_share"} <= set(trained["flags"]) and trained[
        "top_ending"
    ] == "should i do"
