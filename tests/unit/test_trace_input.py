"""Bad trace files fail with one line naming the file, the row and the column."""

from __future__ import annotations

import pytest

from jupyterhub_gpupool.cli import main as cli_main
from jupyterhub_gpupool.simulate import traces

NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model"
POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec"
GOOD_NODES = [NODE_HEADER, "n0,64000,262144,2,T4", "n1,96000,786432,8,G2"]
GOOD_PODS = [POD_HEADER, "p0,4000,8192,1,500,", "p1,8000,16384,1,1000,T4|G2", "p2,2000,4096,0,0,"]


def write(tmp_path, name, lines):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize(
    ("lines", "row", "column", "words"),
    [
        (["sn,cpu_milli,gpu,model", "n0,64000,2,T4"], 1, "memory_mib", "missing node column"),
        (
            [NODE_HEADER, "n0,64000,262144,2,T4", "n1,0,262144,2,T4"],
            3,
            "cpu_milli",
            "zero-capacity",
        ),
        ([NODE_HEADER, "n0,64000,262144,0,T4"], 2, "gpu", "zero-capacity node 'n0'"),
        ([NODE_HEADER, "n0,64000,,2,T4"], 2, "memory_mib", "empty"),
        ([NODE_HEADER, "n0,64000,262144,2,"], 2, "model", "no model"),
        ([NODE_HEADER, "n0,64000,262144,two,T4"], 2, "gpu", "'two' is not a number"),
        ([NODE_HEADER, "n0,64000,262144,2,T4", "n0,64000,262144,2,T4"], 3, "sn", "already"),
        ([NODE_HEADER, "n0,64000,262144"], 2, "gpu", "shorter than the header"),
    ],
)
def test_bad_node_lists_name_file_row_and_column(tmp_path, lines, row, column, words):
    path = write(tmp_path, "nodes.csv", lines)
    with pytest.raises(traces.TraceError) as exc:
        traces.load_nodes(path)
    err = exc.value
    assert (err.path, err.row, err.column) == (str(path), row, column)
    assert str(err).startswith(f"{path}: row {row}, column {column!r}: ")
    assert words in str(err) and "\n" not in str(err)


@pytest.mark.parametrize(
    ("lines", "row", "column", "words"),
    [
        (["name,cpu_milli,num_gpu,gpu_milli", "p0,1,1,1"], 1, "memory_mib", "missing pod column"),
        ([POD_HEADER, "p0,4000,8192,1,500,", "p1,-5,8192,0,0,"], 3, "cpu_milli", "negative"),
        ([POD_HEADER, "p0,4000,8192,x,500,"], 2, "num_gpu", "'x' is not a number"),
        ([POD_HEADER, "p0,4000,nan,1,500,"], 2, "memory_mib", "not a finite number"),
        ([POD_HEADER, ",4000,8192,1,500,"], 2, "name", "empty pod name"),
    ],
)
def test_bad_pod_lists_name_file_row_and_column(tmp_path, lines, row, column, words):
    path = write(tmp_path, "pods.csv", lines)
    with pytest.raises(traces.TraceError) as exc:
        traces.load_pods(path)
    assert (exc.value.row, exc.value.column) == (row, column)
    assert words in str(exc.value) and str(path) in str(exc.value)


def test_unknown_gpu_model_in_a_pod_spec_points_at_its_first_row(tmp_path):
    nodes = traces.load_nodes(write(tmp_path, "nodes.csv", GOOD_NODES))
    pods_path = write(
        tmp_path, "pods.csv", [*GOOD_PODS, "p3,1000,1024,1,300,T4|H200", "p4,1,1,0,0,"]
    )
    pods = traces.load_pods(pods_path)
    with pytest.raises(traces.TraceError) as exc:
        traces.check_models(pods, nodes)
    assert (exc.value.row, exc.value.column) == (5, "gpu_spec")
    assert "unknown GPU model H200" in str(exc.value) and "G2, T4" in str(exc.value)
    # the good file passes, and a CPU-only pod's spec is ignored as the simulator does
    traces.check_models(traces.load_pods(write(tmp_path, "ok.csv", GOOD_PODS)), nodes)
    cpu_only = write(tmp_path, "cpu.csv", [POD_HEADER, "p0,1000,1024,0,0,H200"])
    traces.check_models(traces.load_pods(cpu_only), nodes)


def test_the_cli_prints_one_line_for_a_bad_trace(tmp_path, capsys):
    nodes = write(tmp_path, "nodes.csv", [NODE_HEADER, "n0,64000,262144,0,T4"])
    pods = write(tmp_path, "pods.csv", GOOD_PODS)
    code = cli_main(["simulate", "packing", "--pods", str(pods), "--nodes", str(nodes)])
    err = capsys.readouterr().err.strip()
    assert code == 1 and len(err.splitlines()) == 1
    assert f"{nodes}: row 2, column 'gpu': zero-capacity node 'n0'" in err
    missing = tmp_path / "absent.csv"
    code = cli_main(["simulate", "packing", "--pods", str(missing), "--nodes", str(nodes)])
    err = capsys.readouterr().err.strip()
    assert code == 1 and len(err.splitlines()) == 1 and str(missing) in err
