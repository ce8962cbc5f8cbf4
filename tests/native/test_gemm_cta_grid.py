"""opmux/gemm/cta_grid.h: how the CUTLASS GEMM's tuned launch configs are fitted to the problem they
run on (a swizzle, or a cluster along M, that would pad the scheduler's grid of tiles is reduced).
The header is plain C++: built here with the system compiler, no CUDA."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INCLUDE = ROOT / "python" / "opmux" / "kernels" / "jit" / "include"

DRIVER = r"""
#include <cstdio>
#include <cstdlib>
#include "opmux/gemm/cta_grid.h"
using opmux::gemm::CtaGrid;
int main(int argc, char** argv) {
  // argv: kernel swizzle cm cn m n
  CtaGrid c{std::atoi(argv[1]), std::atoi(argv[2]), std::atoi(argv[3]), std::atoi(argv[4])};
  const CtaGrid along_n{0, 1, 1, 2}, plain{1, 1, 1, 1};
  const CtaGrid f = opmux::gemm::fit_cta_grid(c, std::atoll(argv[5]), std::atoll(argv[6]), along_n, plain);
  std::printf("%d %d %d %d\n", f.kernel, f.swizzle, f.cm, f.cn);
  return 0;
}
"""

K6 = (6, 2, 2, 1)  # config 6: the 2x1 cluster, swizzle 2
K0_SW8 = (0, 8, 1, 2)  # config 7: the 1x2 cluster, swizzle 8
K1_SW4 = (1, 4, 1, 1)  # config 8: no cluster, swizzle 4


@pytest.fixture(scope="module")
def fit(tmp_path_factory: pytest.TempPathFactory):
    cxx = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    d = tmp_path_factory.mktemp("cta_grid")
    (d / "driver.cpp").write_text(DRIVER)
    exe = d / "driver"
    subprocess.run(
        [cxx, "-std=c++17", "-O1", f"-I{INCLUDE}", str(d / "driver.cpp"), "-o", str(exe)], check=True
    )

    def run(config: tuple[int, int, int, int], m: int, n: int) -> tuple[int, int]:
        out = subprocess.run(
            [str(exe), *map(str, config), str(m), str(n)], capture_output=True, text=True, check=True
        )
        kernel, swizzle, _cm, _cn = map(int, out.stdout.split())
        return kernel, swizzle

    return run


@pytest.mark.parametrize("config", [K6, K0_SW8, K1_SW4])
@pytest.mark.parametrize("m", [512, 2048, 8192])
@pytest.mark.parametrize("n", [4096, 24576, 57344])
def test_where_nothing_pads_the_config_launches_as_tuned(fit, config, m, n) -> None:
    """The H100 tables were tuned at M = 512, 2048, 8192; on N of whole groups of 16 tiles
    nothing pads there, so the config launches unchanged."""
    assert fit(config, m, n) == (config[0], config[1])


def test_the_swizzle_is_fitted_to_n_too(fit) -> None:
    # N = 576 (5 tiles, 6 with the 1x2 cluster): swizzle 8 would schedule 16 columns, 4 and 2 eight
    assert fit(K0_SW8, 2048, 576) == (0, 1)
    # N = 7168 (56 tiles): swizzle 8 pads to 64 (1.14x, measured 0.85-0.88x id 0); 4 fits 56
    assert fit(K0_SW8, 8192, 7168) == (0, 4)
    # config 6 on N = 576: its swizzle 2 would pad the 5 columns to 6
    assert fit(K6, 512, 576) == (6, 1)


@pytest.mark.parametrize("m", [1, 100, 128, 300, 384, 640, 1152])
def test_a_2x1_cluster_on_an_odd_row_of_tiles_takes_the_1x2_kernel(fit, m) -> None:
    """One, three, five or nine 128-row tiles: the 2x1 cluster would compute a padding row of
    tiles (2x, 1.33x, 1.2x, 1.11x the work); the same tile with its cluster along N instead."""
    kernel, _ = fit(K6, m, 24576)
    assert kernel == 0


def test_or_no_cluster_where_the_columns_would_pad_as_much(fit) -> None:
    """Three rows of tiles on one column of tiles: the 1x2 cluster would pad the column too."""
    assert fit(K6, 384, 128)[0] == 1
    assert fit(K6, 384, 384)[0] == 1  # 3 columns: 4 with the 1x2 cluster
    assert fit(K6, 384, 4096)[0] == 0


@pytest.mark.parametrize("m", [256, 1024, 4096, 17 * 256])
def test_a_2x1_cluster_stays_where_the_rows_pair_up(fit, m) -> None:
    assert fit(K6, m, 24576)[0] == 6


def test_the_swizzle_is_halved_until_the_rows_pad_little(fit) -> None:
    # 9 rows of 128: swizzle 8 would schedule 16 (1.78x), 4 -> 12, 2 -> 10 (1.11x); 1 -> 9
    assert fit(K0_SW8, 9 * 128, 24576) == (0, 1)
    # 12 rows: 8 -> 16 (1.33x); 4 -> 12 exactly
    assert fit(K0_SW8, 12 * 128, 24576) == (0, 4)
    # 100 rows: 8 -> 104 (1.04x): kept
    assert fit(K0_SW8, 100 * 128, 24576) == (0, 8)
    # 2x1 cluster, swizzle 2, 6 rows: the rows pair up (6) but swizzle 2 wants 8 (1.33x)
    assert fit(K6, 6 * 128, 24576) == (6, 1)


def test_small_problems_keep_what_cutlass_would_pick_anyway(fit) -> None:
    """Below two rows of tiles CUTLASS itself takes no swizzle: nothing to fit."""
    assert fit(K1_SW4, 100, 24576) == (1, 4)  # swizzle 4 asked, CUTLASS runs 1: no padding
