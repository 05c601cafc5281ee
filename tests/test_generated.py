"""CPU check that csrc/sm90/wgmma_ops.cuh is what scripts/gen_wgmma.py writes (the script is the
wrappers' source of truth: an edit to the header alone would be lost at the next regeneration)."""
import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("gen_wgmma", ROOT / "scripts" / "gen_wgmma.py")
gen_wgmma = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gen_wgmma)


def test_wgmma_ops_is_the_generators_output(tmp_path, monkeypatch):
    out = tmp_path / "wgmma_ops.cuh"
    monkeypatch.setattr(gen_wgmma, "OUT", str(out))
    gen_wgmma.main()
    assert out.read_text() == (ROOT / "csrc" / "sm90" / "wgmma_ops.cuh").read_text(), \
        "csrc/sm90/wgmma_ops.cuh differs from scripts/gen_wgmma.py's output: run the script"


def test_transpose_flags_per_kind():
    """The PTX operands after scale-a and scale-b: A's and B's transpose (1: MN-major)."""
    text = (ROOT / "csrc" / "sm90" / "wgmma_ops.cuh").read_text()
    for name, flags in (("wgmma_ss_n32", "1, 1, 0, 0"), ("wgmma_ss_n64", "1, 1, 0, 0"),
                        ("wgmma_ss_tt_n64", "1, 1, 1, 1"), ("wgmma_ss_tb_n128", "1, 1, 0, 1"),
                        ("wgmma_rs_n128", "1, 1, 1;")):
        body = text.split(f"void {name}<__half>(", 1)[1].split("}\n", 1)[0]
        assert f'"{flags}' in body, (name, flags)
