// Corrupt and hostile GGUF files (issue 3, acceptance 4). Every file is made here from a
// valid in-memory file; each must fail with its own specific GgufError message, never a
// crash, hang or huge allocation (the sanitizer and fuzz builds run these too).
#include <gtest/gtest.h>

#include <functional>
#include <optional>

#include "gguf/gguf_file.h"
#include "gguf/model_config.h"
#include "test_util.h"

namespace worker {
namespace {

using test::Bytes;

constexpr uint32_t T_U8 = 0, T_U32 = 4, T_I32 = 5, T_F32 = 6, T_BOOL = 7, T_STR = 8, T_ARR = 9,
                   T_U64 = 10;

struct Kv {
  std::string key;
  uint32_t type;
  std::vector<uint8_t> payload;  // the encoded value
};
struct Tn {
  std::string name;
  std::vector<uint64_t> ne;
  uint32_t type;
  uint64_t offset;
};
struct Spec {
  uint32_t magic = 0x46554747;
  uint32_t version = 3;
  std::optional<uint64_t> n_tensors, n_kv;  // override the true counts
  std::vector<Kv> kvs;
  std::vector<Tn> tensors;
  std::vector<uint8_t> data;
  size_t align = 32;
};
// Byte positions of each section in a serialized file.
struct Marks {
  std::vector<size_t> kv;      // start of each key-value pair
  std::vector<size_t> tensor;  // start of each tensor info
  size_t infos_end = 0;
  size_t data = 0;
};

std::vector<uint8_t> enc_u32(uint32_t v) {
  return Bytes().u32(v).b;
}
std::vector<uint8_t> enc_str(const std::string& s) {
  return Bytes().str(s).b;
}

std::vector<uint8_t> serialize(const Spec& s, Marks* m = nullptr) {
  Marks mk;
  Bytes b;
  b.u32(s.magic).u32(s.version).u64(s.n_tensors.value_or(s.tensors.size()));
  b.u64(s.n_kv.value_or(s.kvs.size()));
  for (const auto& kv : s.kvs) {
    mk.kv.push_back(b.size());
    b.str(kv.key).u32(kv.type).raw(kv.payload);
  }
  for (const auto& t : s.tensors) {
    mk.tensor.push_back(b.size());
    b.str(t.name).u32(static_cast<uint32_t>(t.ne.size()));
    for (uint64_t d : t.ne) b.u64(d);
    b.u32(t.type).u64(t.offset);
  }
  mk.infos_end = b.size();
  b.pad_to(s.align);
  mk.data = b.size();
  b.raw(s.data);
  if (m) *m = mk;
  return b.b;
}

// The valid base: four metadata entries and two tensors (F32 [8, 2] and Q8_0 [32]).
Spec base() {
  Spec s;
  s.kvs.push_back({"general.architecture", T_STR, enc_str("llama")});
  s.kvs.push_back({"k.u32", T_U32, enc_u32(7)});
  s.kvs.push_back({"k.arr", T_ARR, Bytes().u32(T_U8).u64(3).u8(1).u8(2).u8(3).b});
  s.kvs.push_back({"k.str", T_STR, enc_str("hi")});
  // Long names so that a cut inside the second tensor info passes the count check.
  s.tensors.push_back({"tensor.alpha.weight", {8, 2}, 0, 0});
  s.tensors.push_back({"tensor.beta.weight", {32}, 8, 64});
  s.data.assign(64 + 34, 0x11);
  return s;
}

struct Case {
  std::string name;
  std::function<std::vector<uint8_t>()> make;
  std::string expect;  // substring of the error message
};

std::vector<uint8_t> cut(const std::vector<uint8_t>& v, size_t n) {
  return std::vector<uint8_t>(v.begin(), v.begin() + static_cast<long>(std::min(n, v.size())));
}

Marks base_marks() {
  Marks m;
  serialize(base(), &m);
  return m;
}

std::vector<uint8_t> with(const std::function<void(Spec&)>& f) {
  Spec s = base();
  f(s);
  return serialize(s);
}

std::vector<uint8_t> kv_file(const std::string& key, uint32_t type, std::vector<uint8_t> payload) {
  return with([&](Spec& s) { s.kvs.push_back({key, type, std::move(payload)}); });
}

std::vector<uint8_t> tensor_file(const Tn& t, size_t extra_data = 0) {
  return with([&](Spec& s) {
    s.tensors.push_back(t);
    s.data.resize(s.data.size() + extra_data, 0x22);
  });
}

std::vector<Case> cases() {
  const auto v = serialize(base());
  const Marks m = base_marks();
  std::vector<Case> c;
  auto trunc = [&](std::string name, size_t n, std::string expect) {
    c.push_back({std::move(name), [v, n] { return cut(v, n); }, std::move(expect)});
  };
  // --- truncated at every section ---
  trunc("Empty", 0, "truncated while reading magic");
  trunc("InMagic", 3, "truncated while reading magic");
  trunc("InVersion", 6, "truncated while reading version");
  trunc("InTensorCount", 12, "truncated while reading tensor count");
  trunc("InMetadataCount", 20, "truncated while reading metadata count");
  trunc("InKeyLength", m.kv[3] + 4, "truncated while reading key of metadata entry 3 length");
  trunc("InKeyBytes", m.kv[3] + 8 + 2, "key of metadata entry 3 length 5 exceeds");
  trunc("InValueType", m.kv[1] + 8 + 5 + 2, "value type of metadata key k.u32");
  trunc("InScalarValue", m.kv[1] + 8 + 5 + 4 + 2, "truncated while reading value of k.u32");
  trunc("InArrayType", m.kv[2] + 8 + 5 + 4 + 1, "element type of array k.arr");
  trunc("InArrayCount", m.kv[2] + 8 + 5 + 4 + 4 + 3, "element count of array k.arr");
  trunc("InArrayItems", m.kv[2] + 8 + 5 + 4 + 4 + 8 + 1, "array k.arr claims 3 elements");
  trunc("InStringValue", m.kv[3] + 8 + 5 + 4 + 8 + 1, "string value of k.str length 2 exceeds");
  trunc("InTensorNameLength", m.tensor[1] + 6, "truncated while reading name of tensor 1 length");
  trunc("InTensorName", m.tensor[1] + 8 + 3, "name of tensor 1 length 18 exceeds the 3 bytes");
  trunc("InfosBeforeCountCheck", m.tensor[0] + 3, "tensor count 2 is more than the 3 bytes left");
  trunc("InTensorDims", m.tensor[1] + 8 + 18 + 2, "dimension count of tensor 'tensor.beta.weight'");
  trunc("InTensorShape", m.tensor[1] + 8 + 18 + 4 + 5,
        "dimension 0 of tensor 'tensor.beta.weight'");
  trunc("InTensorType", m.tensor[1] + 8 + 18 + 4 + 8 + 1, "type of tensor 'tensor.beta.weight'");
  trunc("InTensorOffset", m.tensor[1] + 8 + 18 + 4 + 8 + 4 + 7,
        "data offset of tensor 'tensor.beta.weight'");
  trunc("BeforePadding", m.infos_end, "file truncated before the data section");
  trunc("InFirstTensorData", m.data + 10, "tensor 'tensor.alpha.weight' data [0, 64) lies past");
  trunc("InLastTensorData", v.size() - 1, "tensor 'tensor.beta.weight' data [64, 98) lies past");
  // --- header ---
  auto hdr = [&](std::string name, std::function<void(Spec&)> f, std::string expect) {
    c.push_back({std::move(name), [f] { return with(f); }, std::move(expect)});
  };
  hdr(
      "WrongMagic", [](Spec& s) { s.magic = 0x47554747; }, "bad magic 0x47554747");
  hdr(
      "GgmlMagic", [](Spec& s) { s.magic = 0x67676d6c; }, "bad magic 0x67676d6c");
  hdr(
      "Version1", [](Spec& s) { s.version = 1; }, "unsupported GGUF version 1");
  hdr(
      "Version2", [](Spec& s) { s.version = 2; }, "unsupported GGUF version 2, only version 3");
  hdr(
      "Version4", [](Spec& s) { s.version = 4; }, "unsupported GGUF version 4");
  hdr(
      "BigEndian", [](Spec& s) { s.version = 0x03000000; }, "big-endian file");
  hdr(
      "TensorCountAtLimit", [](Spec& s) { s.n_tensors = 10000; },
      "tensor count 10000 exceeds the limit of 9999");
  hdr(
      "TensorCountHuge", [](Spec& s) { s.n_tensors = ~0ull; }, "exceeds the limit of 9999");
  hdr(
      "TensorCountBeyondFile", [](Spec& s) { s.n_tensors = 9000; },
      "tensor count 9000 is more than the");
  hdr(
      "MetadataCountHuge", [](Spec& s) { s.n_kv = 1ull << 62; },
      "metadata count 4611686018427387904 is more than");
  // one entry too many: tensor 0 is read as a metadata entry, and its remains as a name
  hdr(
      "MetadataCountOneTooMany", [](Spec& s) { s.n_kv = 5; },
      "name of tensor 0 length 562949953421312 exceeds");
  // --- metadata ---
  auto kv = [&](std::string name, std::string key, uint32_t type, std::vector<uint8_t> payload,
                std::string expect) {
    c.push_back({std::move(name), [key, type, payload] { return kv_file(key, type, payload); },
                 std::move(expect)});
  };
  kv("StringLengthHuge", "k.s", T_STR, Bytes().u64(1ull << 62).b,
     "string value of k.s length 4611686018427387904 exceeds");
  kv("StringLengthPastEof", "k.s", T_STR, Bytes().u64(100000).raw({'a', 'b'}).b,
     "string value of k.s length 100000 exceeds");
  c.push_back({"KeyLengthHuge",
               [] {
                 Spec s = base();
                 auto b = serialize(s);
                 Marks mm;
                 serialize(s, &mm);
                 const uint64_t huge = ~0ull;
                 std::memcpy(&b[mm.kv[1]], &huge, 8);
                 return b;
               },
               "key of metadata entry 1 length 18446744073709551615 exceeds"});
  kv("EmptyKey", "", T_U32, enc_u32(1), "metadata entry 4 has an empty key");
  kv("DuplicateKey", "k.u32", T_U32, enc_u32(1), "duplicate metadata key k.u32");
  kv("UnknownValueType", "k.x", 13, enc_u32(1), "value type of metadata key k.x 13 is not a GGUF");
  kv("ValueTypeAllOnes", "k.x", 0xFFFFFFFFu, enc_u32(1), "4294967295 is not a GGUF value type");
  kv("BoolNotZeroOrOne", "k.b", T_BOOL, {2}, "bool value of k.b is 2");
  kv("ArrayCountHugeU8", "k.a", T_ARR, Bytes().u32(T_U8).u64(1ull << 40).b,
     "array k.a claims 1099511627776 elements of type UINT8");
  kv("ArrayCountHugeStrings", "k.a", T_ARR, Bytes().u32(T_STR).u64(1ull << 60).b,
     "array k.a claims 1152921504606846976 elements of type STRING");
  kv("ArrayCountHugeArrays", "k.a", T_ARR, Bytes().u32(T_ARR).u64(~0ull).b,
     "elements of type ARRAY, more than");
  kv("ArrayElemTypeBad", "k.a", T_ARR, Bytes().u32(77).u64(1).b,
     "element type of array k.a 77 is not a GGUF value type");
  kv("ArrayStringItemPastEof", "k.a", T_ARR, Bytes().u32(T_STR).u64(2).str("ok").u64(999).b,
     "string value of k.a[1] length 999 exceeds");
  {
    Bytes deep;  // arrays nested 10 deep
    for (int i = 0; i < 10; ++i) deep.u32(T_ARR).u64(1);
    deep.u32(T_U8).u64(0);
    kv("ArrayNestedTooDeep", "k.deep", T_ARR, deep.b, "arrays nested deeper than 8 levels");
  }
  {
    Bytes bomb;  // 5M one-byte values: more values than the reader will hold in memory
    const uint64_t n = 5u << 20;
    bomb.u32(T_U8).u64(n);
    bomb.b.resize(bomb.b.size() + n, 1);
    kv("ArrayValueBomb", "k.bomb", T_ARR, bomb.b, "more than 4194304 metadata values in total");
  }
  {
    Bytes nest;  // 2 x 3M nested: each inner array fits, the total does not
    nest.u32(T_ARR).u64(2);
    for (int i = 0; i < 2; ++i) {
      nest.u32(T_U8).u64(3u << 20);
      nest.b.resize(nest.b.size() + (3u << 20), 0);
    }
    kv("NestedArrayBomb", "k.nest", T_ARR, nest.b, "more than 4194304 metadata values in total");
  }
  kv("AlignmentZero", "general.alignment", T_U32, enc_u32(0),
     "general.alignment 0 is not a power of two");
  kv("AlignmentNotPow2", "general.alignment", T_U32, enc_u32(48),
     "general.alignment 48 is not a power of two");
  kv("AlignmentWrongType", "general.alignment", T_STR, enc_str("32"),
     "general.alignment has type STRING, expected UINT32");
  kv("AlignmentMisalignsOffsets", "general.alignment", T_U32, enc_u32(128),
     "tensor 'tensor.beta.weight' data offset 64 is not a multiple of the alignment 128");
  // --- tensor infos ---
  auto tn = [&](std::string name, Tn t, std::string expect, size_t extra = 0) {
    c.push_back({std::move(name), [t, extra] { return tensor_file(t, extra); }, std::move(expect)});
  };
  tn("ZeroDims", {"z", {}, 0, 128}, "tensor 'z' has 0 dimensions, expected 1 to 4");
  tn("FiveDims", {"z", {1, 1, 1, 1, 1}, 0, 128}, "tensor 'z' has 5 dimensions");
  tn("DimZero", {"z", {4, 0}, 0, 128}, "tensor 'z' dimension 1 is 0");
  tn("DimNegative", {"z", {4, ~0ull}, 0, 128}, "dimension 1 is 18446744073709551615");
  tn("ElementCountOverflow", {"z", {1ull << 40, 1ull << 40}, 0, 128},
     "tensor 'z' element count overflows int64");
  tn("UnknownType", {"z", {4}, 99, 128}, "tensor 'z' has unknown tensor type 99");
  tn("TypeHuge", {"z", {4}, 0x80000000u, 128}, "unknown tensor type 2147483648");
  tn("Q4_0RowNotBlockMultiple", {"z", {33}, 2, 128},
     "type Q4_0 has rows of 33 elements, not a multiple of the block size 32");
  tn("Q4_KRowNotBlockMultiple", {"z", {128, 2}, 12, 128}, "not a multiple of the block size 256");
  tn("SizeBeyondFile", {"z", {1ull << 30, 4}, 0, 128}, "more than the whole file");
  tn("MisalignedOffset", {"z", {4}, 0, 100}, "tensor 'z' data offset 100 is not a multiple");
  tn("OffsetPastEnd", {"z", {4}, 0, 1ull << 20}, "tensor 'z' data [1048576, 1048592) lies past");
  tn("OffsetWraps", {"z", {8}, 0, ~0ull - 31}, "lies past the end of the data section");
  tn("OverlapsPrevious", {"z", {8}, 0, 96},
     "tensor 'z' data at offset 96 overlaps tensor 'tensor.beta.weight'", 64);
  tn("OverlapsFirst", {"z", {8}, 0, 32}, "overlaps tensor 'tensor.alpha.weight' at [0, 64)", 64);
  tn("DuplicateName", {"tensor.alpha.weight", {8}, 0, 128},
     "duplicate tensor name 'tensor.alpha.weight'", 64);
  c.push_back({"TensorNameLengthHuge",
               [] {
                 Spec s = base();
                 Marks mm;
                 auto b = serialize(s, &mm);
                 const uint64_t huge = 1ull << 50;
                 std::memcpy(&b[mm.tensor[1]], &huge, 8);
                 return b;
               },
               "name of tensor 1 length 1125899906842624 exceeds"});
  return c;
}

class GgufCorrupt : public ::testing::TestWithParam<Case> {};

// REQ: M0-W-1200 M0-W-1210 M0-W-1211 M0-W-1221 WRK-D2
TEST_P(GgufCorrupt, FailsWithSpecificError) {
  const auto bytes = GetParam().make();
  try {
    GgufFile::from_memory(bytes.data(), bytes.size(), "corrupt.gguf");
    FAIL() << "parsed without error";
  } catch (const GgufError& e) {
    EXPECT_NE(std::string(e.what()).find(GetParam().expect), std::string::npos)
        << "message: " << e.what() << "\nexpected to contain: " << GetParam().expect;
    EXPECT_EQ(std::string(e.what()).rfind("corrupt.gguf: ", 0), 0u) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(All, GgufCorrupt, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& p) { return p.param.name; });

// REQ: M0-W-1200 M0-W-1211
TEST(GgufCorruptBase, BaseFileIsValid) {
  const auto v = serialize(base());
  auto f = GgufFile::from_memory(v.data(), v.size());
  EXPECT_EQ(f->tensors().size(), 2u);
  EXPECT_EQ(f->tensor("tensor.beta.weight").nbytes, 34u);
  Marks m;
  serialize(base(), &m);
  EXPECT_NE(m.infos_end % 32, 0u);  // so BeforePadding really cuts the padding
  EXPECT_EQ(f->get_u64("k.u32"), 7u);
  // Cutting anywhere in the file fails with a GgufError (never a crash).
  for (size_t n = 0; n < v.size(); ++n) {
    const auto b = cut(v, n);
    EXPECT_THROW(GgufFile::from_memory(b.data(), b.size()), GgufError) << n;
  }
}

// ---- model-level errors: a tiny llama model built here ----

Spec tiny_model(uint32_t embd_type, bool bad_wq = false) {
  // n_embd 256 (one K block), 1 layer, 1 head, ff 256, vocab 4.
  Spec s;
  s.kvs.push_back({"general.architecture", T_STR, enc_str("llama")});
  for (auto [k, v] :
       std::vector<std::pair<std::string, uint32_t>>{{"llama.context_length", 64},
                                                     {"llama.embedding_length", 256},
                                                     {"llama.block_count", 1},
                                                     {"llama.feed_forward_length", 256},
                                                     {"llama.attention.head_count", 1}}) {
    s.kvs.push_back({k, T_U32, enc_u32(v)});
  }
  s.kvs.push_back({"llama.attention.layer_norm_rms_epsilon", T_F32, Bytes().put<float>(1e-5f).b});
  uint64_t off = 0;
  auto add = [&](const std::string& name, std::vector<uint64_t> ne, uint32_t type) {
    s.tensors.push_back({name, ne, type, off});
    uint64_t n = 1;
    for (auto d : ne) n *= d;
    const uint64_t bytes =
        type == 0 ? n * 4 : n / *ggml_block_size(type) * *ggml_type_block_bytes(type);
    off += (bytes + 31) / 32 * 32;
  };
  add("token_embd.weight", {256, 4}, embd_type);
  add("output_norm.weight", {256}, 0);
  add("blk.0.attn_norm.weight", {256}, 0);
  add("blk.0.attn_q.weight", {256, bad_wq ? 128u : 256u}, 0);
  add("blk.0.attn_k.weight", {256, 256}, 0);
  add("blk.0.attn_v.weight", {256, 256}, 0);
  add("blk.0.attn_output.weight", {256, 256}, 0);
  add("blk.0.ffn_norm.weight", {256}, 0);
  add("blk.0.ffn_gate.weight", {256, 256}, 0);
  add("blk.0.ffn_up.weight", {256, 256}, 0);
  add("blk.0.ffn_down.weight", {256, 256}, 0);
  s.data.assign(off, 0);
  return s;
}

void expect_model_error(const Spec& s, const std::string& expect) {
  const auto b = serialize(s);
  auto f = GgufFile::from_memory(b.data(), b.size(), "model.gguf");
  try {
    auto cfg = read_model_config(*f);
    bind_model_weights(*f, cfg);
    FAIL() << "no error; expected " << expect;
  } catch (const GgufError& e) {
    EXPECT_NE(std::string(e.what()).find(expect), std::string::npos) << e.what();
  }
}

// REQ: M0-W-1214 WRK-D1
TEST(GgufCorruptModel, TinyModelBindsWhenValid) {
  const auto b = serialize(tiny_model(0));
  auto f = GgufFile::from_memory(b.data(), b.size());
  const auto cfg = read_model_config(*f);
  EXPECT_EQ(cfg.vocab_size, 4);
  EXPECT_EQ(cfg.n_head_kv, 1);  // default: head_count
  EXPECT_TRUE(cfg.tied_output);
  EXPECT_EQ(bind_model_weights(*f, cfg).output, f->find_tensor("token_embd.weight"));
}

// REQ: WRK-D2
TEST(GgufCorruptModel, UnsupportedTensorTypeNamesTensorAndType) {
  expect_model_error(tiny_model(13),
                     "tensor 'token_embd.weight' has type Q5_K, which this "
                     "worker does not support");
  expect_model_error(tiny_model(10), "has type Q2_K");
}

// REQ: M0-W-1214
TEST(GgufCorruptModel, WrongShapeNamesTensor) {
  expect_model_error(tiny_model(0, true),
                     "tensor 'blk.0.attn_q.weight' has shape [256, 128], expected [256, 256]");
}

// REQ: M0-W-1212
TEST(GgufCorruptModel, UnsupportedArchitecture) {
  Spec s = tiny_model(0);
  s.kvs[0].payload = enc_str("gpt2");
  expect_model_error(s, "unsupported architecture 'gpt2' (supported: qwen2, llama)");
}

// REQ: M0-W-1211 M0-W-1212
TEST(GgufCorruptModel, MissingRequiredKeys) {
  for (const char* key : {"general.architecture", "llama.context_length", "llama.embedding_length",
                          "llama.block_count", "llama.feed_forward_length",
                          "llama.attention.head_count", "llama.attention.layer_norm_rms_epsilon"}) {
    Spec s = tiny_model(0);
    std::erase_if(s.kvs, [&](const Kv& kv) { return kv.key == key; });
    expect_model_error(s, std::string("missing required key ") + key);
  }
}

// Found by the fuzzer: a huge block_count must not size per-layer state before the
// tensors are checked.
// REQ: M0-W-1211
TEST(GgufCorruptModel, HugeConfigValuesAreRefused) {
  Spec s = tiny_model(0);
  s.kvs[3].payload = enc_u32(4000000);  // llama.block_count
  expect_model_error(s, "block_count 4000000 needs at least 36000000 tensors, the file has 11");
  Spec e = tiny_model(0);
  e.kvs[2].payload = enc_u32(0xFFFFFFFFu);  // llama.embedding_length
  expect_model_error(e, "key llama.embedding_length = 4294967295 is out of range");
}

// REQ: M0-W-1214
TEST(GgufCorruptModel, TokenListMustMatchEmbeddingRows) {
  Spec s = tiny_model(0);
  s.kvs.push_back(
      {"tokenizer.ggml.tokens", T_ARR, Bytes().u32(T_STR).u64(3).str("a").str("b").str("c").b});
  expect_model_error(s, "token_embd.weight has 4 rows but tokenizer.ggml.tokens has 3 entries");
}

// REQ: M0-W-1214
TEST(GgufCorruptModel, MissingTensorAndBadHeadCounts) {
  Spec s = tiny_model(0);
  s.tensors.pop_back();
  expect_model_error(s, "missing tensor 'blk.0.ffn_down.weight'");
  Spec h = tiny_model(0);
  h.kvs.push_back({"llama.attention.head_count_kv", T_U32, enc_u32(3)});
  expect_model_error(h, "head_count 1 is not a multiple of head_count_kv 3");
}

// ---- quant_kind: general.file_type first, the dominant tensor type as the fallback ----

std::string quant_kind_with(std::optional<Kv> file_type, uint32_t embd_type = 0) {
  Spec s = tiny_model(embd_type);
  if (file_type) s.kvs.push_back(*file_type);
  const auto b = serialize(s);
  return read_model_config(*GgufFile::from_memory(b.data(), b.size())).quant_kind;
}

Kv file_type_u32(uint32_t v) {
  return {"general.file_type", T_U32, enc_u32(v)};
}

// REQ: M0-W-1320 WRK-D12 M0-W-1201
TEST(GgufQuantKind, FileTypeNamesTheQuantizerMix) {
  // The tensors are F32 (one case a Q5_0 token_embd); the key says what the quantizer meant.
  EXPECT_EQ(quant_kind_with(file_type_u32(15)), "Q4_K_M");
  EXPECT_EQ(quant_kind_with(file_type_u32(14)), "Q4_K_S");
  EXPECT_EQ(quant_kind_with(file_type_u32(1)), "F16");
  EXPECT_EQ(quant_kind_with(file_type_u32(32)), "BF16");
  EXPECT_EQ(quant_kind_with(file_type_u32(0), 8), "F32");
  // gguf-py writes u32, but any non-negative integer type carries the same value.
  EXPECT_EQ(quant_kind_with(Kv{"general.file_type", T_I32, Bytes().put<int32_t>(7).b}), "Q8_0");
  EXPECT_EQ(quant_kind_with(Kv{"general.file_type", T_U64, Bytes().u64(18).b}), "Q6_K");
}

// REQ: M0-W-1320 WRK-D12
TEST(GgufQuantKind, MissingOrUnusableFileTypeFallsBackToTheDominantTensorType) {
  EXPECT_EQ(quant_kind_with(std::nullopt), "F32");
  // Removed from llama.cpp (4..6, 33..35), past its enum, or its "guessed" flag (1024).
  for (uint32_t v : {4u, 6u, 33u, 35u, 42u, 1024u | 15u}) {
    EXPECT_EQ(quant_kind_with(file_type_u32(v)), "F32") << v;
  }
  EXPECT_EQ(quant_kind_with(Kv{"general.file_type", T_I32, Bytes().put<int32_t>(-1).b}), "F32");
  EXPECT_EQ(quant_kind_with(Kv{"general.file_type", T_STR, enc_str("Q4_K_M")}), "F32");
  EXPECT_EQ(quant_kind_with(Kv{"general.file_type", T_F32, Bytes().put<float>(15.0f).b}), "F32");
}

}  // namespace
}  // namespace worker
