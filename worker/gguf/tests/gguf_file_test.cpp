// GGUF reader: every metadata type, nested arrays, tensor infos, alignment, data offsets.
#include "gguf/gguf_file.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>

#include "test_util.h"

namespace worker {
namespace {

using test::Bytes;

// A file holding one key of every value type, a nested array and two tensors.
std::vector<uint8_t> every_type_file(uint32_t alignment) {
  Bytes b;
  const uint64_t n_kv = alignment == 32 ? 15 : 16;
  b.u32(0x46554747).u32(3).u64(2).u64(n_kv);
  b.str("k.u8").u32(0).u8(200);
  b.str("k.i8").u32(1).put<int8_t>(-5);
  b.str("k.u16").u32(2).put<uint16_t>(60000);
  b.str("k.i16").u32(3).put<int16_t>(-30000);
  b.str("k.u32").u32(4).u32(4000000000u);
  b.str("k.i32").u32(5).put<int32_t>(-2000000000);
  b.str("k.f32").u32(6).put<float>(1.5f);
  b.str("k.bool").u32(7).u8(1);
  b.str("k.str").u32(8).str("héllo");
  b.str("k.u64").u32(10).u64(1ull << 60);
  b.str("k.i64").u32(11).put<int64_t>(-(1ll << 60));
  b.str("k.f64").u32(12).put<double>(-2.25);
  b.str("k.arr_str").u32(9).u32(8).u64(3).str("a").str("").str("ccc");
  b.str("k.arr_i32").u32(9).u32(5).u64(2).put<int32_t>(-1).put<int32_t>(7);
  // [[1, 2], [], [3]] as arrays of u16
  b.str("k.nested").u32(9).u32(9).u64(3);
  b.u32(2).u64(2).put<uint16_t>(1).put<uint16_t>(2);
  b.u32(2).u64(0);
  b.u32(2).u64(1).put<uint16_t>(3);
  if (alignment != 32) b.str("general.alignment").u32(4).u32(alignment);
  // tensors: a [4, 2] F32 at offset 0 and a [32] Q8_0 at the next aligned offset
  b.str("t.a").u32(2).u64(4).u64(2).u32(0).u64(0);
  const uint64_t off_b = (32 + alignment - 1) / alignment * alignment;
  b.str("t.b").u32(1).u64(32).u32(8).u64(off_b);
  b.pad_to(alignment);
  const size_t data_start = b.size();
  for (int i = 0; i < 8; ++i) b.put<float>(static_cast<float>(i));
  while (b.size() - data_start < off_b) b.u8(0);
  for (int i = 0; i < 34; ++i) b.u8(static_cast<uint8_t>(i));
  return b.b;
}

// REQ: M0-W-1200 M0-W-1211
TEST(GgufFile, ParsesEveryMetadataType) {
  const auto data = every_type_file(32);
  auto f = GgufFile::from_memory(data.data(), data.size());
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->get_u64("k.u8"), 200u);
  EXPECT_EQ(f->find("k.i8")->as_i64(), -5);
  EXPECT_EQ(f->get_u64("k.u16"), 60000u);
  EXPECT_EQ(f->find("k.i16")->as_i64(), -30000);
  EXPECT_EQ(f->get_u64("k.u32"), 4000000000u);
  EXPECT_EQ(f->find("k.i32")->as_i64(), -2000000000);
  EXPECT_EQ(f->get_f64("k.f32"), 1.5);
  EXPECT_TRUE(f->get_bool("k.bool", false));
  EXPECT_EQ(f->get_string("k.str"), "héllo");
  EXPECT_EQ(f->get_u64("k.u64"), 1ull << 60);
  EXPECT_EQ(f->find("k.i64")->as_i64(), -(1ll << 60));
  EXPECT_EQ(f->get_f64("k.f64"), -2.25);
  EXPECT_EQ(f->get_string_array("k.arr_str"), (std::vector<std::string>{"a", "", "ccc"}));
  EXPECT_EQ(f->get_int_array("k.arr_i32"), (std::vector<int64_t>{-1, 7}));
  const GgufArray& nested = f->find("k.nested")->as_array();
  ASSERT_EQ(nested.elem_type, GgufValueType::ARRAY);
  ASSERT_EQ(nested.items.size(), 3u);
  EXPECT_EQ(nested.items[0].as_array().items[1].as_u64(), 2u);
  EXPECT_TRUE(nested.items[1].as_array().items.empty());
  EXPECT_EQ(nested.items[2].as_array().items[0].as_u64(), 3u);
  // typed access refuses lossy conversions
  EXPECT_THROW(f->find("k.i8")->as_u64(), GgufError);
  EXPECT_THROW(f->get_string("k.u8"), GgufError);
  EXPECT_THROW(f->get_u64("missing.key"), GgufError);
  EXPECT_EQ(f->get_u64("missing.key", 17), 17u);
  EXPECT_EQ(f->get_string("missing.key", "x"), "x");
}

// REQ: M0-W-1211 M0-W-1221
TEST(GgufFile, TensorInfosAndDataOffsetsDefaultAlignment) {
  const auto data = every_type_file(32);
  auto f = GgufFile::from_memory(data.data(), data.size());
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_EQ(f->data_offset() % 32, 0u);
  ASSERT_EQ(f->tensors().size(), 2u);
  const TensorInfo& a = f->tensor("t.a");
  EXPECT_EQ(a.ne, (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(a.type, GgmlType::F32);
  EXPECT_EQ(a.nbytes, 32u);
  EXPECT_EQ(a.rows(), 2);
  EXPECT_EQ(a.n_elements(), 8);
  EXPECT_EQ(a.data, data.data() + f->data_offset());  // in place, no copy
  float v;
  std::memcpy(&v, a.row(1) + 4, 4);
  EXPECT_EQ(v, 5.0f);
  const TensorInfo& b = f->tensor("t.b");
  EXPECT_EQ(b.type, GgmlType::Q8_0);
  EXPECT_EQ(b.nbytes, 34u);
  EXPECT_EQ(b.data[1], 1);
  EXPECT_EQ(f->find_tensor("nope"), nullptr);
  EXPECT_THROW(f->tensor("nope"), GgufError);
}

// REQ: M0-W-1211
TEST(GgufFile, HonoursGeneralAlignment) {
  const auto data = every_type_file(64);
  auto f = GgufFile::from_memory(data.data(), data.size());
  EXPECT_EQ(f->alignment(), 64u);
  EXPECT_EQ(f->data_offset() % 64, 0u);
  EXPECT_EQ(f->tensor("t.b").offset, 64u);
  EXPECT_EQ(f->tensor("t.b").data[33], 33);
}

// REQ: M0-W-1221 M0-W-1210
TEST(GgufFile, OpensByMmapAndReportsMissingFile) {
  const auto data = every_type_file(32);
  const std::string path = ::testing::TempDir() + "/gguf_file_test.gguf";
  {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(data.data()),
              static_cast<std::streamsize>(data.size()));
  }
  auto f = GgufFile::open(path);
  EXPECT_EQ(f->file_size(), data.size());
  EXPECT_EQ(f->get_string("k.str"), "héllo");
  std::remove(path.c_str());
  try {
    GgufFile::open(path);
    FAIL();
  } catch (const GgufError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot open"), std::string::npos) << e.what();
  }
}

// REQ: M0-W-1200 M0-W-1211
TEST(GgufFile, ReadsStories260K) {
  auto f = GgufFile::open(test::shared_fixtures() + "/stories260K.gguf");
  EXPECT_EQ(f->get_string("general.architecture"), "llama");
  EXPECT_EQ(f->tensors().size(), 48u);
  EXPECT_EQ(f->get_string_array("tokenizer.ggml.tokens").size(), 512u);
  EXPECT_EQ(f->get_float_array("tokenizer.ggml.scores").size(), 512u);
  const TensorInfo& e = f->tensor("token_embd.weight");
  EXPECT_EQ(e.ne, (std::vector<int64_t>{64, 512}));
  EXPECT_EQ(e.data - f->tensors()[0].data, 0);
  EXPECT_EQ(f->data_offset() + e.offset, 14176u);  // as gguf-py reports it
}

}  // namespace
}  // namespace worker
