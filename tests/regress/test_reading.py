"""The generated reading restates the summary's ΔRMSE ranges, the paper's, and the Full-O vs OA count."""

from oretrofit.regress.reading import reading
from oretrofit.regress.summary import Row, Summary


def _summary() -> Summary:
    summary = Summary(taus=[1e-8, 1.0], arms=["base", "oa", "full-o"], datasets=["a", "b"],
                      names={"a": "A", "b": "B"})
    for spec, oa, full_o, paper in (("a", 2.0, 5.0, (0.1, 9.0)), ("b", -4.0, 3.0, None)):
        summary.rows += [Row(1.0, spec, spec.upper(), "oa", 3, d_rmse_pct=oa,
                             paper_d_rmse_pct=paper and paper[0], most_gated_module="icl.0",
                             most_gated_below_half=0.3 if spec == "a" else 0.1),
                         Row(1.0, spec, spec.upper(), "full-o", 3, d_rmse_pct=full_o,
                             paper_d_rmse_pct=paper and paper[1])]
    # At τ = 1e-8 only OA ran: no line for it.
    summary.rows.append(Row(1e-8, "a", "A", "oa", 3, d_rmse_pct=0.0))
    return summary


def test_reading_states_ranges_paper_ranges_and_direction():
    assert reading(_summary()) == [
        "* τ = 1: OA ΔRMSE -4% to +2% (paper: +0.1% to +0.1% on the 1 dataset(s) it reports); "
        "most gated module `icl.0` on 2 of 2 datasets (up to 30.0% of its presences below ½); "
        "Full-O ΔRMSE +3% to +5% (paper: +9% to +9% on the 1 dataset(s) it reports). "
        "Full-O changes RMSE more than OA on 1 of 2 datasets."]
