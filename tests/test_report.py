"""report.html building blocks."""

from rlhfkit.eval.report import table_html, write_report


def test_long_cells_are_collapsed_behind_their_first_lines_and_everything_is_escaped(tmp_path):
    post = "\n".join(f"line {i} <b>not bold</b>" for i in range(10))
    html = table_html([{"post": post, "score": 0.123456, "short": "a < b"}], ["post", "score", "short"])
    assert "<details><summary>line 0 &lt;b&gt;not bold&lt;/b&gt;\nline 1" in html
    assert "line 3" not in html.split("</summary>")[0] and "line 9" in html  # the rest is one click away
    assert "<td>0.1235</td>" in html and "<td>a &lt; b</td>" in html
    report = write_report(tmp_path, "t", [("Samples", html)])
    assert "<details>" in report.read_text()
