// A step's inputs (engine/step_inputs.h): a block table narrower than the graph's leaves every
// other section where it was, so ModelRunner::execute_graph can upload the sections before it with
// one copy and only the used block-table columns into the graph's wider table.
#include "engine/step_inputs.h"

#include <gtest/gtest.h>

#include <cstring>
#include <utility>

namespace crl::engine {
namespace {

TEST(StepInputsTest, ANarrowBlockTableKeepsTheOtherSectionsAndTheUsedColumns) {
  // Two decoding sequences (contexts 5 and 40 at block size 16: 1 and 3 blocks) padded to four
  // rows, in a table 128 columns wide and in one just wide enough.
  Request req;
  Sequence a, b;
  a.request = b.request = &req;
  a.tokens.assign(5, 7);
  b.tokens.assign(40, 9);
  a.block_table = {4};
  b.block_table = {1, 8, 2};
  SchedulerOutput batch;
  batch.seqs = {{&a, 4, 1, true}, {&b, 39, 1, true}};
  batch.num_tokens = 2;
  const StepLayout wide(4, 4, 0, 0, 128), narrow(4, 4, 0, 0, 3);
  ASSERT_EQ(wide.bt, narrow.bt);
  at::Tensor w = step_host_buffer(wide, at::kCPU), n = step_host_buffer(narrow, at::kCPU);
  const Filled fw = fill_step(batch, 16, wide, w), fn = fill_step(batch, 16, narrow, n);
  EXPECT_EQ(fw.max_ctx, 40);
  EXPECT_EQ(fn.max_ctx, 40);
  const std::pair<int64_t, int64_t> sections[] = {// (offset, bytes), alignment padding left out
                                                  {wide.tok, 4 * 8},
                                                  {wide.pos, 4 * 8},
                                                  {wide.slot, 4 * 8},
                                                  {wide.qs, 5 * 4},
                                                  {wide.cl, 4 * 4}};
  for (const auto& [off, bytes] : sections) {
    EXPECT_EQ(std::memcmp(w.data_ptr<uint8_t>() + off, n.data_ptr<uint8_t>() + off, bytes), 0)
        << "section at " << off;
  }
  const auto* bw = reinterpret_cast<const int32_t*>(w.data_ptr<uint8_t>() + wide.bt);
  const auto* bn = reinterpret_cast<const int32_t*>(n.data_ptr<uint8_t>() + narrow.bt);
  for (int row = 0; row < 4; ++row) {
    for (int col = 0; col < 3; ++col) {
      EXPECT_EQ(bw[row * 128 + col], bn[row * 3 + col]) << row << "," << col;
    }
  }
  EXPECT_EQ(bn[3 + 0], 1);
  EXPECT_EQ(bn[3 + 2], 2);
  // The slots and the padding rows' empty slots.
  const auto* slot = reinterpret_cast<const int64_t*>(n.data_ptr<uint8_t>() + narrow.slot);
  EXPECT_EQ(slot[0], 4 * 16 + 4);
  EXPECT_EQ(slot[1], 2 * 16 + 39 % 16);
  EXPECT_EQ(slot[2], -1);
  EXPECT_EQ(slot[3], -1);
}

}  // namespace
}  // namespace crl::engine
