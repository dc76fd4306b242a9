"""How a library's error is quoted inside ours."""

from pipeline.core.errors import reason


def test_reason_is_the_first_line_cut_or_the_type_when_empty():
    assert reason(ValueError("bad footer\nat byte 12")) == "bad footer"
    assert reason(OSError("x" * 300)) == "x" * 200
    assert reason(OSError("abcdef"), limit=3) == "abc"
    assert reason(KeyError()) == "KeyError"
    assert reason(OSError("\nsecond line only")) == "OSError"
