// A consumer loop for CUTLASS's sm90 blockwise-scaled fp8 mainloop that keeps the tensor cores
// busy while the partial sums are promoted.
//
// CUTLASS's collective (sm90_mma_tma_gmma_ss_warpspecialized_fp8_blockwise_scaling.hpp) issues a
// k-tile's wgmma batch into a temporary fp32 tile, waits for it (wgmma.wait_group 0), then promotes
// it: acc += partial * a_scale * b_scale. Both consumer warp groups of a cooperative CTA reach the
// wait together, so the tensor cores idle for every k-tile's promotion (64 FFMAs a thread on a
// 128x128 tile, plus the wait's drain).
//
// `OverlappedPromotionMma<Collective>` is that collective with its consumer loop replaced: the
// partial sums alternate between two register tiles, k-tile t+1's batch is issued before k-tile
// t is promoted, and the wait is for all but the newest batch (wait_group 1), so the promotion
// runs under the next batch. Loads, pipeline, shared memory, scale copies and the epilogue are the
// collective's own (inherited). Cost: one more partial-sum tile of registers (64 a thread on a
// 128x128 cooperative tile: 192 of the consumer's 232 for the three tiles) and one more pipeline
// stage held by the consumer at a time. A stage is released as soon as its batch has retired, and
// each k-tile's scales are read from shared memory before that, as in the collective.
#pragma once

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/gemm/collective/collective_builder.hpp"

namespace opmux {
namespace gemm {

template <class Collective>
struct OverlappedPromotionMma : Collective {
  using typename Collective::MainloopPipeline;
  using typename Collective::PipelineState;
  using typename Collective::TensorStorage;
  using typename Collective::Params;
  using typename Collective::TiledMma;
  using typename Collective::TileShape;
  using typename Collective::SmemLayoutA;
  using typename Collective::SmemLayoutB;
  using typename Collective::SmemLayoutSFA;
  using typename Collective::SmemLayoutSFB;
  using typename Collective::ElementBlockScale;
  static constexpr int kScaleMs = Collective::ScaleMsPerTile;  // a_scale values along the tile's M
  static constexpr int kScaleNs = Collective::ScaleNsPerTile;  // b_scale values along its N
  // One promotion a k-tile: the loop below ignores the collective's ScalePromotionInterval.
  static_assert(cute::size<2>(TileShape{}) == Collective::ScaleGranularityK,
                "OverlappedPromotionMma: the k-tile must be one scale block along K");

  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState smem_pipe_read, FrgTensorC& accum,
                          int k_tile_count, int thread_idx, TensorStorage& shared_tensors,
                          Params const& /*mainloop_params*/) {
    using namespace cute;
    static_assert(is_rmem<FrgTensorC>::value, "the accumulator must live in registers");

    Tensor sA = make_tensor(make_smem_ptr(shared_tensors.smem_A.data()), SmemLayoutA{});  // (M,K,PIPE)
    Tensor sB = make_tensor(make_smem_ptr(shared_tensors.smem_B.data()), SmemLayoutB{});  // (N,K,PIPE)
    // The scales broadcast over the tile: a_scale along N (stride 0), b_scale along M.
    Tensor sSFA = make_tensor(
        make_smem_ptr(shared_tensors.smem_SFA.data()),
        make_layout(make_shape(get<0>(shape(SmemLayoutSFA{})), get<1>(TileShape{}),
                               make_shape(get<1>(shape(SmemLayoutSFA{})), get<2>(shape(SmemLayoutSFA{})))),
                    make_stride(get<0>(stride(SmemLayoutSFA{})), _0{},
                                make_stride(get<1>(stride(SmemLayoutSFA{})), get<2>(stride(SmemLayoutSFA{}))))));
    Tensor sSFB = make_tensor(
        make_smem_ptr(shared_tensors.smem_SFB.data()),
        make_layout(make_shape(get<0>(TileShape{}), get<0>(shape(SmemLayoutSFB{})),
                               make_shape(get<1>(shape(SmemLayoutSFB{})), get<2>(shape(SmemLayoutSFB{})))),
                    make_stride(_0{}, get<0>(stride(SmemLayoutSFB{})),
                                make_stride(get<1>(stride(SmemLayoutSFB{})), get<2>(stride(SmemLayoutSFB{}))))));

    constexpr int kWarpGroupThreads = cutlass::NumThreadsPerWarpGroup;
    constexpr int kWarpGroups = size(TiledMma{}) / kWarpGroupThreads;
    const auto warp_group_layout = make_layout(Int<kWarpGroups>{}, Int<kWarpGroupThreads>{});
    const int warp_group = __shfl_sync(0xffffffff, thread_idx / kWarpGroupThreads, 0);
    TiledMma tiled_mma;
    auto thread_mma = tiled_mma.get_slice(warp_group_layout(warp_group));
    Tensor tCsSFA = tiled_mma.get_slice(thread_idx).partition_C(sSFA);  // (MMA,MMA_M,MMA_N,(K,PIPE))
    Tensor tCsSFB = tiled_mma.get_slice(thread_idx).partition_C(sSFB);
    Tensor tCrA = thread_mma.make_fragment_A(thread_mma.partition_A(sA));  // (MMA,MMA_M,MMA_K,PIPE)
    Tensor tCrB = thread_mma.make_fragment_B(thread_mma.partition_B(sB));  // (MMA,MMA_N,MMA_K,PIPE)
    CUTE_STATIC_ASSERT_V(size<1>(tCrA) == size<1>(accum));
    CUTE_STATIC_ASSERT_V(size<1>(tCrB) == size<2>(accum));

    // Two partial-sum tiles and their scales, named statically (a runtime index would put them in
    // local memory): the loop below runs two k-tiles a trip.
    Tensor part0 = make_fragment_like(accum);
    Tensor part1 = make_fragment_like(accum);
    Tensor sfa0 = make_tensor_like<ElementBlockScale>(tCsSFA(_, _, _, _0{}));
    Tensor sfa1 = make_tensor_like<ElementBlockScale>(tCsSFA(_, _, _, _0{}));
    Tensor sfb0 = make_tensor_like<ElementBlockScale>(tCsSFB(_, _, _, _0{}));
    Tensor sfb1 = make_tensor_like<ElementBlockScale>(tCsSFB(_, _, _, _0{}));

    // A k-tile's scales into registers, the one with a single value per tile folded into the other.
    auto load_scales = [&](auto& sfa, auto& sfb, int stage) {
      copy(tCsSFA(_, _, _, make_coord(_0{}, stage)), sfa);
      copy(tCsSFB(_, _, _, make_coord(_0{}, stage)), sfb);
      if constexpr (kScaleMs == 1 && kScaleNs == 1) {
        sfa(_0{}) = sfa(_0{}) * sfb(_0{});
      } else if constexpr (kScaleMs > 1 && kScaleNs == 1) {
        const ElementBlockScale b = sfb(_0{});
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < size(filter_zeros(sfa)); ++i) filter_zeros(sfa)(i) = filter_zeros(sfa)(i) * b;
      } else if constexpr (kScaleMs == 1 && kScaleNs > 1) {
        const ElementBlockScale a = sfa(_0{});
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < size(filter_zeros(sfb)); ++i) filter_zeros(sfb)(i) = filter_zeros(sfb)(i) * a;
      }
    };
    // A k-tile's wgmma batch into `part` (zeroed by the first MMA), committed as one group.
    auto issue = [&](auto& part, int stage) {
      tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
      warpgroup_fence_operand(part);
      warpgroup_arrive();
      CUTLASS_PRAGMA_UNROLL
      for (int k_block = 0; k_block < size<2>(tCrA); ++k_block) {
        cute::gemm(tiled_mma, tCrA(_, _, k_block, stage), tCrB(_, _, k_block, stage), part);
        tiled_mma.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
      warpgroup_fence_operand(part);
    };
    // acc += part * a_scale * b_scale, once `part`'s batch has retired.
    auto promote = [&](auto& part, auto& sfa, auto& sfb) {
      warpgroup_fence_operand(part);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(accum); ++i) {
        if constexpr (kScaleMs == 1 && kScaleNs == 1) {
          accum(i) += part(i) * sfa(_0{});
        } else if constexpr (kScaleMs > 1 && kScaleNs == 1) {
          accum(i) += part(i) * sfa(i);
        } else if constexpr (kScaleMs == 1 && kScaleNs > 1) {
          accum(i) += part(i) * sfb(i);
        } else {
          accum(i) += part(i) * sfa(i) * sfb(i);
        }
      }
    };

    PipelineState smem_pipe_release = smem_pipe_read;
    // Wait for k-tile `smem_pipe_read`'s data, take its scales and issue its batch into `part`.
    auto start = [&](auto& part, auto& sfa, auto& sfb) {
      auto token = pipeline.consumer_try_wait(smem_pipe_read);
      pipeline.consumer_wait(smem_pipe_read, token);
      const int stage = smem_pipe_read.index();
      load_scales(sfa, sfb, stage);
      issue(part, stage);
      ++smem_pipe_read;
    };
    // Once all but the newest batch have retired: free the oldest stage, promote its partial sums.
    auto retire = [&](auto& part, auto& sfa, auto& sfb) {
      warpgroup_wait<1>();
      pipeline.consumer_release(smem_pipe_release);
      ++smem_pipe_release;
      promote(part, sfa, sfb);
    };

    // Two k-tiles a trip. A batch in flight reaches a merge of control flow only where both sides
    // hold it in the same registers (the back edge, the skip of the first trip's retire); every
    // exit waits for everything. (A first version issued k-tile 0 before the loop: ptxas copied
    // its registers into the loop's and injected a full wait there, C7517.) The last k-tile's
    // stage is released by the collective's mma_tail, as after its own loop.
    clear(accum);
    // No k-tile: nothing to wait for or release. The ptr-array collective's mma_tail skips an empty
    // K too; the plain one's would not, and its callers never pass one (K >= 1 is checked).
    if (k_tile_count <= 0) return;
    CUTLASS_PRAGMA_NO_UNROLL
    for (int t = 0;; t += 2) {
      start(part0, sfa0, sfb0);
      if (t > 0) retire(part1, sfa1, sfb1);
      if (t + 1 == k_tile_count) {
        warpgroup_wait<0>();
        promote(part0, sfa0, sfb0);
        break;
      }
      start(part1, sfa1, sfb1);
      retire(part0, sfa0, sfb0);
      if (t + 2 == k_tile_count) {
        warpgroup_wait<0>();
        promote(part1, sfa1, sfb1);
        break;
      }
    }
    warpgroup_fence_operand(accum);
  }
};

}  // namespace gemm
}  // namespace opmux
