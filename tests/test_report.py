import pytest

from pipeline.stages.report import END, START, ladder_rows, render, splice


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


def test_results_folders_render_as_their_own_tables(tmp_path):
    """Each results/<machine>/ folder becomes its own section, old documents (no setup_s or
    wall_s) included, labelled with the commit they were measured at."""
    import json

    from pipeline.stages.report import results_docs

    new = doc("mnist", 70.0)
    new["env"].update(commit="abc1234", date="2026-11-23")
    new["variants"]["device"].update(setup_s=0.05, wall_s=1.35, wall_speedup=310.0, cuda_graph=True)
    (tmp_path / "h100").mkdir()
    (tmp_path / "h100" / "mnist.json").write_text(json.dumps(new))
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "mnist.json").write_text(json.dumps(doc("mnist", 60.0)))
    (tmp_path / "empty").mkdir()
    machines = results_docs(tmp_path)
    assert [name for name, _ in machines] == ["h100", "old"]
    body = render([], None, machines)
    assert "### `results/h100/`" in body and "commit abc1234, 2026-11-23" in body
    assert "| device (graph) | 2.000 | 0.100 | n/a | 0.05 | 1.35 | 0.9700 (outside tolerance) | 3.3x / 310.0x |" in body
    assert "| naive * | 60.000 | 1.000 | n/a | n/a | n/a | n/a | 1.0x |" in body  # old schema: n/a
