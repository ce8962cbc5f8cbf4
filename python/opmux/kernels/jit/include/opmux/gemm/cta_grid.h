// The CTA grid of the CUTLASS GEMM's persistent tile scheduler, and how a tuned launch config is
// fitted to the problem it runs on. Plain C++17 (no CUDA, no CUTLASS): tests/native builds it.
//
// CUTLASS's sm90 persistent scheduler (PersistentTileSchedulerSm90Params) rounds the grid of
// output tiles up to the cluster shape, picks its swizzle from the smaller side of that grid, and
// rounds each side up to swizzle x cluster; its CTAs compute the padding tiles too (on zero-filled
// TMA loads, the stores clipped): a 2x1 cluster on one 128-row tile does twice the work. A config
// is tuned per shape at a few M and looked up for every M near them, and the swizzle CUTLASS takes
// changes with M, so at launch the config keeps its cluster and swizzle only where they pad each
// side of the grid by at most 1/16 over the cluster's own rounding. The tuner times configs
// through this fit, so a table measures what it launches.
#pragma once

#include <algorithm>
#include <cstdint>

namespace opmux {
namespace gemm {

struct CtaGrid {
  int kernel;   // the unit's kernel index
  int swizzle;  // the scheduler's largest swizzle (1, 2, 4, 8)
  int cm, cn;   // that kernel's cluster shape
};

inline int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

// CUTLASS's own choice of swizzle for a grid of mb x nb cluster-rounded tiles
// (tile_scheduler_params.h, get_log_swizzle_size), as a factor.
inline int scheduler_swizzle(int64_t mb, int64_t nb, int max_swizzle) {
  const int64_t d = std::min(mb, nb);
  if (max_swizzle >= 8 && d >= 6) return 8;
  if (max_swizzle >= 4 && d >= 3) return 4;
  if (max_swizzle >= 2 && d >= 2) return 2;
  return 1;
}

inline bool pads_little(int64_t scheduled, int64_t base) { return scheduled * 16 <= base * 17; }

// The config as launched on an M x N problem (128x128 tiles): a cluster along M that pads the rows
// of tiles by more than 1/16 replaced by `along_n` (the same tile, its cluster along N), or by
// `plain` (no cluster) where that would pad the columns as much; then the swizzle halved until
// neither side pads by more than 1/16 over the cluster's rounding.
inline CtaGrid fit_cta_grid(CtaGrid c, int64_t m, int64_t n, CtaGrid along_n, CtaGrid plain) {
  const int64_t mb = (m + 127) / 128, nb = (n + 127) / 128;
  if (c.cm > 1 && !pads_little(round_up(mb, c.cm), mb)) {
    const CtaGrid to = pads_little(round_up(nb, along_n.cn), nb) ? along_n : plain;
    c = CtaGrid{to.kernel, c.swizzle, to.cm, to.cn};
  }
  const int64_t mc = round_up(mb, c.cm), nc = round_up(nb, c.cn);
  while (c.swizzle > 1) {
    const int64_t s = scheduler_swizzle(mc, nc, c.swizzle);
    if (pads_little(round_up(mc, s * c.cm), mc) && pads_little(round_up(nc, s * c.cn), nc)) break;
    c.swizzle /= 2;
  }
  return c;
}

}  // namespace gemm
}  // namespace opmux
