"""The Python objects an API call hands its stage (`rlhfkit.supplied`): held for the call alone."""

import threading

import pytest

from rlhfkit.errors import ConfigError
from rlhfkit.supplied import lookup, supplying


def test_two_calls_in_threads_each_see_their_own_object_under_the_same_name():
    barrier = threading.Barrier(2, timeout=10)
    seen: dict[int, object] = {}
    failures: list[BaseException] = []

    def call(index: int) -> None:
        try:
            with supplying({"python:model": f"model {index}"}):
                barrier.wait()  # both calls hold their object at once
                seen[index] = lookup("python:model", "model")
                barrier.wait()
        except BaseException as e:  # the thread's failure, to fail the test with
            failures.append(e)

    threads = [threading.Thread(target=call, args=(i,)) for i in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures and seen == {0: "model 0", 1: "model 1"}


def test_a_nested_call_shares_the_object_refuses_another_and_nothing_is_held_after():
    model, other = object(), object()
    with supplying({"python:model": model}):
        with supplying({"python:model": model, "python:score": len}):
            assert lookup("python:model", "model") is model and lookup("python:score", "reward_functions") is len
        with (
            pytest.raises(ConfigError, match="python:model: another object of this name is in use"),
            supplying({"python:model": other}),
        ):
            pass
        with pytest.raises(ConfigError, match="reward_functions=python:score was a Python object"):
            lookup("python:score", "reward_functions")
    with pytest.raises(ConfigError, match="model=python:model was a Python object given to rlhfkit's Python API"):
        lookup("python:model", "model")
