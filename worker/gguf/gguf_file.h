#pragma once
// GGUF v3 reader over mmap (M0-W-1200, 1210, 1211, 1221). Parses in place; every size,
// count, offset and string length is checked against the file. Any problem throws
// GgufError naming what is wrong and the byte offset where it was found.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "gguf/ggml_types.h"

namespace worker {

class GgufError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class GgufValueType : uint32_t {
  UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6,
  BOOL = 7, STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};

struct GgufValue;
struct GgufArray {
  GgufValueType elem_type;
  std::vector<GgufValue> items;
};
// Strings are copied out of the mapping (metadata is small compared with tensor data;
// the tokenizer arrays of 150k strings are a few MB).
struct GgufValue {
  GgufValueType type;
  std::variant<uint64_t, int64_t, double, bool, std::string, std::shared_ptr<GgufArray>> v;

  // Typed access; throws GgufError when the stored type does not convert losslessly.
  uint64_t as_u64() const;
  int64_t as_i64() const;
  double as_f64() const;
  bool as_bool() const;
  const std::string& as_string() const;
  const GgufArray& as_array() const;
};

struct TensorInfo {
  std::string name;
  std::vector<int64_t> ne;  // ggml order: ne[0] is the contiguous (row) dimension
  uint32_t type_raw = 0;    // as stored; may be a type we do not support
  GgmlType type = GgmlType::F32;
  uint64_t offset = 0;      // relative to the data section
  const uint8_t* data = nullptr;  // into the mapping
  size_t nbytes = 0;

  int64_t n_elements() const;
  int64_t rows() const;  // product of ne[1..]
  int64_t row_len() const { return ne.empty() ? 0 : ne[0]; }
  size_t row_bytes() const { return ggml_row_bytes(type, row_len()); }
  const uint8_t* row(int64_t r) const { return data + static_cast<size_t>(r) * row_bytes(); }
};

class GgufFile {
 public:
  // mmaps and parses `path`. Throws GgufError on any problem (missing file included).
  static std::shared_ptr<GgufFile> open(const std::string& path);
  // Parses a buffer held in memory (tests, fuzzers). The buffer must outlive the file.
  static std::shared_ptr<GgufFile> from_memory(const uint8_t* data, size_t size,
                                               std::string label = "<memory>");
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  size_t file_size() const { return size_; }
  size_t alignment() const { return alignment_; }
  size_t data_offset() const { return data_offset_; }

  const std::map<std::string, GgufValue>& metadata() const { return kv_; }
  const GgufValue* find(std::string_view key) const;
  // Required/optional typed getters. Missing required keys throw GgufError("missing key ...").
  std::string get_string(std::string_view key) const;
  std::string get_string(std::string_view key, std::string_view fallback) const;
  uint64_t get_u64(std::string_view key) const;
  uint64_t get_u64(std::string_view key, uint64_t fallback) const;
  double get_f64(std::string_view key) const;
  double get_f64(std::string_view key, double fallback) const;
  bool get_bool(std::string_view key, bool fallback) const;
  std::vector<std::string> get_string_array(std::string_view key) const;
  std::vector<int64_t> get_int_array(std::string_view key) const;
  std::vector<double> get_float_array(std::string_view key) const;

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(std::string_view name) const;
  // Throws GgufError naming the tensor when absent.
  const TensorInfo& tensor(std::string_view name) const;

 private:
  GgufFile() = default;
  void parse();

  std::string path_;
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
  bool mapped_ = false;
  uint32_t version_ = 0;
  size_t alignment_ = 32;
  size_t data_offset_ = 0;
  std::map<std::string, GgufValue> kv_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

}  // namespace worker
