"""The other scripts under benchmarks/: their pure pieces and their arguments, without a GPU."""

from __future__ import annotations

import dataclasses
import pathlib

import pytest

SCRIPTS = sorted(p.stem for p in (pathlib.Path(__file__).resolve().parents[2] / "benchmarks").glob("*.py")
                 if p.stem != "harness")


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_script_explains_itself(script, name, monkeypatch, capsys):
    module = script(name)
    monkeypatch.setattr("sys.argv", [f"{name}.py", "--help"])
    with pytest.raises(SystemExit) as done:
        module.main()
    out = capsys.readouterr().out
    assert done.value.code == 0 and out.startswith("usage:") and "--" in out


# ----------------------------------------------------------------------------------
# gluon_sass.py: the hot loops of a kernel's machine code
# ----------------------------------------------------------------------------------
SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_1:
        /*0010*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [UR4], R2 ;
        /*0020*/              @!P1 BRA `(.L_x_9) ;
.L_x_2:
        /*0030*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR12], RZ, !UPT ;
        /*0040*/                   MUFU.EX2 R3, R4 ;
        /*0050*/                   FFMA R5, R6, R7, R8 ;
        /*0060*/                   STL [R1], R9 ;
        /*0070*/                   LDL R9, [R1] ;
        /*0080*/               @P0 BRA `(.L_x_2) ;
        /*0090*/                   FADD R5, R6, R7 ;
        /*00a0*/               @P2 BRA `(.L_x_1) ;
        /*00b0*/                   EXIT ;
.L_x_9:
        /*00c0*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [UR4], R2 ;
        /*00d0*/              @!P1 BRA `(.L_x_9) ;
        /*00e0*/                   BRA `(.L_x_2) ;
"""


def test_gluon_sass_finds_the_innermost_wgmma_loop_and_counts_its_spills(script):
    sass = script("gluon_sass")
    instrs, labels = sass.parse(SASS)
    assert len(instrs) == 15 and labels == {".L_x_1": 1, ".L_x_2": 3, ".L_x_9": 12}
    # the inner loop [.L_x_2, its branch back]: not the outer one around it, not the retry stub
    # (no wgmma) nor its unconditional jump back
    (loop, ) = sass.wgmma_loops(instrs, labels)
    assert (loop.start, loop.end) == (3, 8)
    assert loop.counts == {"wgmma": 1, "MUFU": 1, "fp32": 1, "spill": 2, "integer and other": 1}


def test_gluon_sass_names_a_field_the_config_does_not_have(script):
    sass = script("gluon_sass")

    @dataclasses.dataclass(frozen=True)
    class Config:
        BLOCK_M: int = 64

    assert sass.configured(Config(), {"BLOCK_M": "128"}) == Config(128)
    with pytest.raises(sass.FieldError, match="Config has no such field"):
        sass.configured(Config(), {"NO_SUCH": "1"})


# ----------------------------------------------------------------------------------
# bad arguments, named before any GPU work
# ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name, argv, message", [
    ("gluon_sass", ["--config", "BLOCK_M=abc"], "expected NAME=INTEGER"),
    ("gluon_profile", ["--pass", "xyz"], "--pass: invalid choice"),
    ("gluon_profile", ["--configs", "default,foo"], "--configs: 'foo' is not one of"),
    ("gluon_profile", ["--pass", "bwd", "--bwd-configs", "f2"], "--bwd-configs: 'f2' is not one of"),
    ("gluon_profile", ["--rows", "grid-d512"], "--rows: unknown row"),
    ("gluon_profile", ["--device", "cpu"], "sm_90 GPU"),
    ("fp32_precision", ["--device", "cpu", "--rounds", "0"], "--rounds: expected a positive number"),
    ("host_breakdown", ["--iters", "0"], "expected positive integers"),
])
def test_a_bad_argument_is_named(script, name, argv, message, capsys):
    with pytest.raises(SystemExit) as done:
        script(name).main(argv)
    assert done.value.code == 2 and message in capsys.readouterr().err


# ----------------------------------------------------------------------------------
# variants.py and fp8_sweep.py
# ----------------------------------------------------------------------------------
def test_documents_are_mixed_fixed_and_sum_to_the_tokens(script):
    variants = script("variants")
    lengths = variants.document_lengths(16384)
    assert sum(lengths) == 16384 and lengths == variants.document_lengths(16384)
    assert len(lengths) >= 4 and max(lengths) <= 4096 and min(lengths[:-1]) >= 128
    assert len(set(lengths)) > len(lengths) // 2  # mixed, not one length
    assert sum(variants.document_lengths(4096, longest=4096)) == 4096


def test_the_variants_flops_count_the_visible_work(script):
    variants = script("variants")
    import harness

    # one document of N tokens: the causal FLOPs of the protocol's count
    assert variants.causal_flops([4096], 32, 128) == harness.Shape(1, 32, 32, 4096, 4096, 128, True).flops("fwd")
    assert variants.causal_flops([1, 2], 1, 1) == 2.0 * (1 + 4)
    # a window as wide as the sequence is causal: n (n + 1) / 2 pairs; window 0 keeps the diagonal
    assert variants.window_pairs(10, 9) == variants.window_pairs(10, 100) == 55
    assert variants.window_pairs(10, 0) == 10
    assert variants.window_pairs(16384, 4096) == sum(min(i, 4096) + 1 for i in range(16384))


def test_the_variants_rows_report_speedups_and_goals(script):
    variants = script("variants")
    row = variants.Row("fp8", "case", "fwd", "fp8", 1e12,
                       ms={"fp8": 1.0, "fp8+relayout": 1.25, "flashtune-bf16": 1.5, "cudnn-bf16": None})
    assert row.speedups() == {"fp8+relayout": 1.25, "flashtune-bf16": 1.5}
    assert row.tflops()["fp8"] == pytest.approx(1000.0)
    line = variants.format_row(row)
    assert "fp8=1.000ms(1000)" in line and "cudnn-bf16=n/a " in line
    assert "[goal vs flashtune-bf16 >= 1.3: met]" in line and "fp8+relayout vs flashtune-bf16: 1.20x" in line
    row.ms["fp8"] = 1.4
    assert "MISSED" in variants.format_row(row)
    assert "ABORTED: boom" in variants.format_row(variants.Row("window", "c", "fwd", "flashtune", 1.0, error="boom"))
    quick, full = variants.parse_args(["--quick"]), variants.parse_args([])
    assert (quick.rounds, full.rounds) == (1, 3) and quick.varlen_tokens < full.varlen_tokens == 16384


def test_the_fp8_sweep_names_the_best_config_on_every_mask(script):
    sweep = script("fp8_sweep")
    results = {"full": sweep.summarize({"flashtune-bf16": 1.5, "gluon a": 1.0, "gluon b": 1.2}, 1e12),
               "causal": sweep.summarize({"flashtune-bf16": 1.3, "gluon a": 1.3, "gluon b": 1.0}, 1e12)}
    assert results["full"]["gluon a"]["x_bf16"] == pytest.approx(1.5) and results["full"]["gluon a"]["tflops"] == 1000
    verdict = sweep.verdict(results)
    assert verdict["best"] == {"full": {"runner": "gluon a", "x_bf16": 1.5}, "causal": {"runner": "gluon b",
                                                                                       "x_bf16": 1.3}}
    # by its worst mask: b (1.25 full, 1.3 causal) over a (1.0 causal)
    assert verdict["best_on_all_masks"] == {"runner": "gluon b", "worst_x_bf16": pytest.approx(1.25)}
    assert not verdict["met"]
