"""The data cases of the bad-inputs review (2026-11): prompts cut to fit `max_query_length` keep some of
their content or are skipped and counted; a record that does not fit is skipped, not the run refused; a
format error names the option that reads the data; warnings start a line while a progress bar is on
screen; a bad UTF-8 byte is named by its line; the help names the other formats."""

from __future__ import annotations

import io

from tqdm import tqdm

from rlhfkit.errors import warn


def test_a_warning_printed_while_a_progress_bar_is_on_screen_starts_a_line(capsys):
    bar_output = io.StringIO()  # tqdm's own line, as it goes to a log file: no newline until the bar closes
    with tqdm(total=2, file=bar_output, desc="scoring") as bar:
        bar.update(1)
        warn("reward function 'raises' failed on row 0")
    warn("after the bar")
    err = capsys.readouterr().err
    assert err == "\nrlhfkit: warning: reward function 'raises' failed on row 0\nrlhfkit: warning: after the bar\n"
