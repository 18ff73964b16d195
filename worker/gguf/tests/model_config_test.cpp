// Model config from <arch>.* keys and the shape-checked weight binding.
#include "gguf/model_config.h"

#include <gtest/gtest.h>

#include "test_util.h"

namespace worker {
namespace {

// REQ: M0-W-1211 M0-W-1212 M0-W-1214 WRK-D1
TEST(GgufModelConfig, Stories260KConfig) {
  auto m = load_model(test::shared_fixtures() + "/stories260K.gguf");
  const ModelConfig& c = m->config;
  EXPECT_EQ(c.arch, Arch::Llama);
  EXPECT_EQ(c.arch_name, "llama");
  EXPECT_EQ(c.n_embd, 64);
  EXPECT_EQ(c.n_layer, 5);
  EXPECT_EQ(c.n_head, 8);
  EXPECT_EQ(c.n_head_kv, 4);
  EXPECT_EQ(c.n_ff, 172);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.n_rot, 8);
  EXPECT_EQ(c.n_ctx_train, 2048);
  EXPECT_FLOAT_EQ(c.norm_eps, 1e-5f);
  EXPECT_FLOAT_EQ(c.rope_base, 10000.0f);
  EXPECT_FALSE(c.rope_neox);
  EXPECT_FALSE(c.tied_output);
  EXPECT_FALSE(c.has_qkv_bias);
  EXPECT_EQ(c.quant_kind, "F32");
  ASSERT_EQ(m->weights.layers.size(), 5u);
  EXPECT_EQ(m->weights.layers[4].w_down->ne, (std::vector<int64_t>{172, 64}));
  EXPECT_EQ(m->weights.output->name, "output.weight");
  EXPECT_EQ(m->weights.token_embd->name, "token_embd.weight");
}

}  // namespace
}  // namespace worker
