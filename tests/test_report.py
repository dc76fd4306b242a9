import pytest

from pipeline.report import END, START, ladder_rows, render, splice


def doc(name, naive_s):
    return {"dataset": name,
            "env": {"device": "cpu0", "device_type": "cpu", "torch": "2", "cpu_count": 2, "threads": 2},
            "params": {"epochs": 5, "batch_size": 512},
            "floor": {"train_s": 1.5},
            "variants": {
                "naive": {"train_s": naive_s, "test_s": 1.0, "total_s": 5 * (naive_s + 1), "accuracy": None,
                          "extrapolated": True, "speedup": 1.0, "samples_per_s": 10},
                "device": {"train_s": 2.0, "test_s": 0.1, "total_s": 10.5, "accuracy": 0.97,
                           "extrapolated": False, "speedup": 3.3, "samples_per_s": 900, "accuracy_ok": False},
            }}


def test_render_and_splice():
    body = render([doc("a", 40.0), doc("b", 50.0)], None)
    assert "| naive * | 40.000 |" in body and "| device | 2.000 |" in body
    assert "0.9700 (outside tolerance)" in body and "Compute floor" in body
    readme = f"intro\n{START}\nold\n{END}\nrest\n"
    out = splice(readme, body)
    assert out.startswith("intro\n") and out.endswith(f"{END}\nrest\n") and "old" not in out
    assert splice(out, body) == out
    with pytest.raises(ValueError, match="markers"):
        splice("no markers", body)


def test_ladder_rows():
    assert ladder_rows([doc("a", 40.0), doc("b", 50.0)]).splitlines() == [
        "variant,a,b", "naive,40.0,50.0", "device,2.0,2.0"]
