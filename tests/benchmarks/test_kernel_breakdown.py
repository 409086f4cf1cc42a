"""The pieces of benchmarks/kernel_breakdown.py that need no GPU: kernel names, the per-call table,
the arguments."""

import pytest


@pytest.fixture(scope="module")
def kb(script):
    return script("kernel_breakdown")


def test_short_names_drop_templates_and_arguments(kb):
    assert kb.short_name("void cudnn::fusion::compute_dot_do_o<256, (int)4>(float*, int)") == \
        "void cudnn::fusion::compute_dot_do_o"
    assert kb.short_name("_gluon_attn_bwd_dkdv_kernel") == "_gluon_attn_bwd_dkdv_kernel"
    long = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, " \
           "std::array<char*, 1ul> >(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)"
    assert kb.short_name(long) == "void at::native::vectorized_elementwise_kernel"
    assert len(kb.short_name("x" * 100, width=20)) == 20


def test_breakdown_sums_per_call_largest_first(kb):
    kernels = [("dkdv", 300.0), ("zero<float>", 20.0), ("dkdv", 310.0), ("zero<float>", 22.0),
               ("copy", 50.0), ("copy", 48.0)]
    rows = kb.breakdown(kernels, calls=2)
    assert [r["kernel"] for r in rows] == ["dkdv", "copy", "zero"]
    assert rows[0]["us"] == pytest.approx(305.0) and rows[0]["launches"] == 1
    assert rows[1]["us"] == pytest.approx(49.0) and rows[2]["us"] == pytest.approx(21.0)
    assert sum(r["share"] for r in rows) == pytest.approx(1.0)
    assert rows[0]["share"] == pytest.approx(610 / 750)
    with pytest.raises(ValueError, match="calls"):
        kb.breakdown(kernels, calls=0)


@pytest.mark.parametrize("argv, message", [(["--pass", "back"], "--pass"), (["--calls", "0"], "--calls"),
                                           (["--anchor", "cudnn,fa2"], "--anchor: expected one anchor"),
                                           (["--rows", "grid-d99"], "--rows: unknown row")])
def test_bad_arguments_are_named(kb, argv, message, capsys):
    with pytest.raises(SystemExit):
        kb.main(argv)
    assert message in capsys.readouterr().err
