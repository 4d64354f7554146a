"""pipe_table: the Markdown pipe-table layout every report uses."""

import pytest

from oretrofit._files.markdown import pipe_table


def test_header_rule_and_rows_joined_without_final_newline() -> None:
    table = pipe_table(["a", "b"], [["1", "2"], ["x", ""]])
    assert table == "| a | b |\n|---|---|\n| 1 | 2 |\n| x |  |"


def test_no_rows_gives_header_and_rule_only() -> None:
    assert pipe_table(["only"], []) == "| only |\n|---|"


def test_right_alignment_per_column() -> None:
    table = pipe_table(["arm", "s", "ratio"], [["oa", "1.0", "2.0×"]],
                       align=["left", "right", "right"])
    assert table.splitlines()[1] == "|---|---:|---:|"


def test_cells_are_str_of_any_value_and_rows_may_be_generators() -> None:
    rows = ((name, value, flag) for name, value, flag in [("n", 4096, True), ("tau", 1e-08, None)])
    assert pipe_table(["k", "v", "f"], rows).splitlines()[2:] == [
        "| n | 4096 | True |", "| tau | 1e-08 | None |"]


@pytest.mark.parametrize("align", [["left"], ["left", "center"]])
def test_bad_align_names_the_fix(align: list[str]) -> None:
    with pytest.raises(ValueError, match="align needs one of"):
        pipe_table(["a", "b"], [], align=align)


def test_row_of_the_wrong_width_is_refused() -> None:
    with pytest.raises(ValueError, match="pad or trim"):
        pipe_table(["a", "b"], [["1", "2", "3"]])
