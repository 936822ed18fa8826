// The model chunks of an interleaved pipeline stage (model/gpt_chunks.h):
// one ParamLayout of several parts lays them out one after another, each
// part as its own layout would, and the chunks draw exactly their tensors of
// the whole model's initialisation and move to and from the whole model's
// buffer by name (the last stage's tied wte comes after its first chunk).
#include "brigade/model/gpt_chunks.h"

#include <gtest/gtest.h>

#include <vector>

namespace brigade {
namespace BRIGADE_TEST_FILE {

GptConfig four_blocks() {
  GptConfig c;
  c.n_layer = 4;
  c.n_head = 2;
  c.n_embd = 16;
  c.block_size = 8;
  c.vocab_size = 37;
  return c;
}

TEST(GptChunks, ALayoutOfPartsIsThePartsOneAfterAnother) {
  const GptConfig cfg = four_blocks();
  // The last of two stages, two chunks: blocks 1 and 3, the head with the second.
  const ParamLayout first(cfg, 0, 1, LayerRange{1, 2}), second(cfg, 0, 1, LayerRange{3, 4});
  const ParamLayout both(cfg, 0, 1, std::vector<LayerRange>{{1, 2}, {3, 4}});
  ASSERT_EQ(both.parts().size(), 2u);
  EXPECT_EQ(both.part_offset(0), 0);
  EXPECT_EQ(both.part_offset(1), first.size());
  EXPECT_EQ(both.size(), first.size() + second.size());
  EXPECT_EQ(both.num_params(), first.num_params() + second.num_params());
  ASSERT_EQ(both.params().size(), first.params().size() + second.params().size());
  for (size_t i = 0; i < second.params().size(); ++i) {
    const ParamInfo& mine = both.params()[first.params().size() + i];
    EXPECT_EQ(mine.name, second.params()[i].name);
    EXPECT_EQ(mine.offset, second.params()[i].offset + first.size()) << mine.name;
  }
  EXPECT_EQ(both.wte(), second.wte() + first.size());
  EXPECT_TRUE(both.params()[first.params().size()].tied_copy);
  EXPECT_EQ(both.ln_f_w(), second.ln_f_w() + first.size());
  EXPECT_EQ(both.block(1).c_fc_w, first.block(1).c_fc_w);
  EXPECT_EQ(both.block(3).c_fc_w, second.block(3).c_fc_w + first.size());
  EXPECT_EQ(both.block(2).c_fc_w, -1);  // another stage's
  EXPECT_TRUE(both.has_head());
  EXPECT_FALSE(both.has_embeddings());
  EXPECT_FALSE(both.whole());
}

TEST(GptChunks, ChunksDrawAndMoveTheirTensorsOfTheWholeModel) {
  const GptConfig cfg = four_blocks();
  const ParamLayout whole(cfg);
  std::vector<float> all(static_cast<size_t>(whole.size()));
  init_gpt2_weights(whole, cfg.n_layer, 9, all.data());
  for (const std::vector<LayerRange>& chunks :
       {std::vector<LayerRange>{{0, 1}, {2, 3}}, std::vector<LayerRange>{{1, 2}, {3, 4}}}) {
    const ParamLayout layout(cfg, 0, 1, chunks);
    std::vector<float> params(static_cast<size_t>(layout.size()), 0.0f), want(params.size());
    GptChunks model(cfg, params.data(), nullptr, nullptr, chunks);
    ASSERT_EQ(model.size(), 2);
    EXPECT_EQ(model.chunk(1).layout().first_layer(), chunks[1].begin);
    model.init_weights(9, params.data());
    global_to_local(layout, whole, all.data(), want.data());
    EXPECT_EQ(params, want) << "blocks " << chunks[0].begin << " and " << chunks[1].begin;
    // And back: every tensor of these chunks lands where the whole model has it.
    std::vector<float> back(all.size(), 0.0f);
    local_to_global(layout, whole, params.data(), back.data());
    for (const ParamInfo& p : layout.params()) {
      const ParamInfo* g = whole.find(p.name);
      ASSERT_NE(g, nullptr);
      for (int64_t i = 0; i < p.numel; ++i) {
        ASSERT_EQ(back[static_cast<size_t>(g->offset + i)], all[static_cast<size_t>(g->offset + i)])
            << p.name;
      }
    }
  }
}

}  // namespace BRIGADE_TEST_FILE
}  // namespace brigade
