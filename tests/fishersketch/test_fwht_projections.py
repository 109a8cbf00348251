"""Walsh–Hadamard transforms and the regenerated projections."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import scipy.linalg
import torch

from fishersketch import Sketcher, SketchSpec, generate_projections
from fishersketch.fwht import GatheredHadamard, KronPlan, choose_plan, fwht, fwht_butterfly, hadamard, kron_factors

CUDA = torch.cuda.is_available()


@pytest.mark.parametrize("f", [1, 2, 4, 8, 64])
def test_hadamard_is_sylvester(f: int) -> None:
    np.testing.assert_array_equal(hadamard(f, torch.float64).numpy(), scipy.linalg.hadamard(f))


@pytest.mark.parametrize("N", [1, 2, 8, 64, 512])
def test_butterfly_and_kron_equal_dense_hadamard(N: int) -> None:
    x = torch.randn(3, N, dtype=torch.float64, generator=torch.Generator().manual_seed(N))
    ref = x @ torch.from_numpy(scipy.linalg.hadamard(N)).double().T
    torch.testing.assert_close(fwht_butterfly(x), ref, rtol=0, atol=1e-9)
    for mf in (2, 8, 32):
        if N == 1:
            continue
        plan = KronPlan(N=N, method="kron", factors=kron_factors(N, mf))
        torch.testing.assert_close(fwht(x, plan), ref, rtol=0, atol=1e-9)


def test_kron_factors() -> None:
    assert kron_factors(1, 32) == ()
    assert kron_factors(2**17, 32) == (16, 16, 16, 32)
    for N in (2, 2**5, 2**10, 2**17, 2**18):
        fac = kron_factors(N, 32)
        assert int(np.prod(fac)) == N and max(fac) <= 32


@pytest.mark.parametrize("N,m,gathered", [(64, 10, 4), (256, 64, 8), (256, 300, 2), (32, 5, 32), (16, 40, 1)])
def test_gathered_stage_selects_the_right_outputs(N: int, m: int, gathered: int) -> None:
    gen = torch.Generator().manual_seed(m)
    x = torch.randn(2 * 3, N, dtype=torch.float64, generator=gen)
    index = torch.randint(0, N, (2, m), generator=gen)
    ref = fwht_butterfly(x).view(2, 3, N)
    plan = KronPlan(N=N, method="kron", factors=kron_factors(N // gathered, 8), gathered=gathered)
    gh = GatheredHadamard(plan, index, torch.float64, torch.device("cpu"))
    out = gh(x.clone())
    for g in range(2):
        torch.testing.assert_close(out[g], ref[g][:, index[g]], rtol=0, atol=1e-9)
    bf = GatheredHadamard(KronPlan(N=N, method="butterfly"), index, torch.float64, torch.device("cpu"))
    torch.testing.assert_close(bf(x.clone()), out, rtol=0, atol=1e-9)


def test_length_2_pow_18_float32_matches_float64_butterfly() -> None:
    N, m = 2**18, 4096
    x = torch.randn(2, N, generator=torch.Generator().manual_seed(0))
    index = torch.sort(torch.randperm(N, generator=torch.Generator().manual_seed(1))[:m]).values.repeat(2, 1)
    plan = choose_plan(N, m, "cpu")
    assert plan.method == "kron" and plan.gathered > 1
    out = GatheredHadamard(plan, index, torch.float32, torch.device("cpu"))(x.clone())
    ref = fwht_butterfly(x.double())[:, index[0]]
    scale = x.double().norm(dim=1, keepdim=True)
    # One row per group: out[g, 0] is row g.
    err = (out[:, 0].double() - ref).abs() / scale
    assert float(err.max()) < 1e-5


def test_choose_plan_rule() -> None:
    assert choose_plan(16, 4, "cpu").method == "butterfly"
    assert choose_plan(2**17, 4096, "cpu").method == "kron"
    assert choose_plan(2**17, 4096, "cpu", method="butterfly").method == "butterfly"
    with pytest.raises(ValueError):
        choose_plan(64, 4, "cpu", method="fft")


def test_projections_have_the_documented_layout() -> None:
    spec = SketchSpec(d=5, K=20, m=48, seed=11, error_projection="srht")
    p = generate_projections(spec)
    assert p.act_signs.dtype == torch.int8 and p.act_signs.shape == (96, 5)
    assert p.srht_signs is not None and p.srht_signs.dtype == torch.int8 and p.srht_signs.shape == (2, 32)
    assert p.srht_index is not None and p.srht_index.shape == (2, 48)
    assert p.err_signs is None
    # m > N: every row appears floor or ceil(m/N) times.
    counts = torch.bincount(p.srht_index[0], minlength=32)
    assert counts.min() >= 1 and counts.max() <= 2
    dense = generate_projections(SketchSpec(d=5, K=20, m=48, seed=11, error_projection="dense"))
    assert dense.err_signs is not None and dense.err_signs.shape == (96, 20)
    # Same seed, same activation signs, whatever the error projection.
    assert torch.equal(dense.act_signs, p.act_signs)
    assert not torch.equal(generate_projections(SketchSpec(d=5, K=20, m=48, seed=12)).act_signs, p.act_signs)


def test_sketcher_projections_equal_explicit_rademacher_rows() -> None:
    spec = SketchSpec(d=7, K=40, m=96, seed=2, error_projection="srht")
    sk = Sketcher(spec, chunk_rows=8)
    gen = torch.Generator().manual_seed(3)
    a, e = torch.randn(11, 7, generator=gen), torch.randn(11, 40, generator=gen)
    u, u2, v, v2 = sk.project(a, e)
    p = sk.projections
    S = p.act_signs.double()
    H = torch.from_numpy(scipy.linalg.hadamard(64)).double()
    R = (H[p.srht_index[0]] * p.srht_signs[0].double())[:, :40]
    R2 = (H[p.srht_index[1]] * p.srht_signs[1].double())[:, :40]
    torch.testing.assert_close(u.double(), a.double() @ S[:96].T, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(u2.double(), a.double() @ S[96:].T, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(v.double(), e.double() @ R.T, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(v2.double(), e.double() @ R2.T, rtol=1e-5, atol=1e-4)


_DIGEST_SCRIPT = textwrap.dedent(
    """
    import sys
    from fishersketch import SketchSpec, generate_projections
    for kind in ("dense", "srht"):
        spec = SketchSpec(d=33, K=300, m=128, seed=2**40 + 5, error_projection=kind)
        print(generate_projections(spec).digest())
    """
)


def test_same_spec_same_projections_in_another_process() -> None:
    out = subprocess.run([sys.executable, "-c", _DIGEST_SCRIPT], capture_output=True, text=True, check=True,
                         timeout=120)
    theirs = out.stdout.split()
    ours = [generate_projections(SketchSpec(d=33, K=300, m=128, seed=2**40 + 5, error_projection=k)).digest()
            for k in ("dense", "srht")]
    assert theirs == ours
    assert ours[0] != ours[1]


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_cpu_and_cuda_projections_and_features_agree() -> None:
    spec = SketchSpec(d=64, K=5000, m=256, seed=9)
    cpu, gpu = Sketcher(spec), Sketcher(spec, device="cuda")
    assert cpu.projections.digest() == gpu.projections.digest()
    gen = torch.Generator().manual_seed(0)
    a, e = torch.randn(40, 64, generator=gen), torch.randn(40, 5000, generator=gen)
    for x, y in zip(cpu.features(a, e), gpu.features(a.cuda(), e.cuda()), strict=True):
        torch.testing.assert_close(y.cpu(), x, rtol=1e-3, atol=1e-3 * float(x.abs().max()))


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("method", ["kron", "butterfly"])
def test_cuda_update_matches_cpu(method: str) -> None:
    spec = SketchSpec(d=48, K=3000, m=512, seed=5, granularity="token")
    gen = torch.Generator().manual_seed(1)
    a, e = torch.randn(300, 48, generator=gen), torch.randn(300, 3000, generator=gen)
    ids = torch.arange(300) // 7
    cpu = Sketcher(spec).sketch(a, e, ids)
    gpu_sk = Sketcher(spec, device="cuda", fwht_method=method)
    gpu = gpu_sk.sketch(a.cuda(), e.cuda(), ids.cuda())
    np.testing.assert_array_equal(cpu.token_counts, gpu.token_counts)
    scale = np.abs(cpu.sums).max()
    assert np.abs(cpu.sums - gpu.sums).max() <= 1e-4 * scale
