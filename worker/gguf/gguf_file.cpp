#include "gguf/gguf_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

namespace worker {

namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" read as little-endian u32
constexpr uint64_t kMaxTensors = 10000;      // M0-W-1210
constexpr uint32_t kMaxDims = 4;             // GGML_MAX_DIMS
constexpr int kMaxArrayDepth = 8;            // arrays of arrays: real files use depth 1
// Each metadata value costs ~56 bytes in memory while it may cost one byte on disk; this
// caps what a hostile file can make us allocate (~250 MB). The largest real vocabularies
// (256k tokens + merges + types) stay far below it.
constexpr uint64_t kMaxMetadataValues = 4u << 20;
constexpr uint64_t kMaxStringBytes = 1u << 30;

std::string type_name(GgufValueType t) {
  static const char* names[] = {"UINT8",  "INT8",    "UINT16", "INT16",  "UINT32",
                                "INT32",  "FLOAT32", "BOOL",   "STRING", "ARRAY",
                                "UINT64", "INT64",   "FLOAT64"};
  auto i = static_cast<uint32_t>(t);
  return i < 13 ? names[i] : "type" + std::to_string(i);
}

// Smallest encoding of one value of the type: used to refuse counts the remaining bytes
// cannot possibly hold before anything is reserved.
size_t min_value_size(GgufValueType t) {
  switch (t) {
    case GgufValueType::UINT8:
    case GgufValueType::INT8:
    case GgufValueType::BOOL: return 1;
    case GgufValueType::UINT16:
    case GgufValueType::INT16: return 2;
    case GgufValueType::UINT32:
    case GgufValueType::INT32:
    case GgufValueType::FLOAT32: return 4;
    case GgufValueType::UINT64:
    case GgufValueType::INT64:
    case GgufValueType::FLOAT64:
    case GgufValueType::STRING:  // u64 length
      return 8;
    case GgufValueType::ARRAY:  // u32 type + u64 count
      return 12;
  }
  return 1;
}

// Bounds-checked little-endian reader over the mapping. Every read names what it reads
// so errors say what is wrong and where.
class Cursor {
 public:
  Cursor(const uint8_t* base, size_t size, const std::string& label)
      : base_(base), size_(size), label_(label) {}

  size_t pos() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }

  [[noreturn]] void fail(const std::string& what, size_t at) const {
    throw GgufError(label_ + ": " + what + " (at byte offset " + std::to_string(at) + ")");
  }
  [[noreturn]] void fail(const std::string& what) const { fail(what, pos_); }

  // `what` is a string or a callable returning one; callables keep the hot path (150k
  // vocabulary strings) free of message building.
  template <typename W>
  static std::string describe(W&& what) {
    if constexpr (std::is_invocable_v<W>) {
      return what();
    } else {
      return std::string(what);
    }
  }

  template <typename W>
  void need(size_t n, W&& what) const {
    if (n > remaining()) {
      fail("file truncated while reading " + describe(what) + ": need " + std::to_string(n) +
           " bytes, " + std::to_string(remaining()) + " left");
    }
  }

  template <typename T, typename W>
  T read(W&& what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, base_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  template <typename W>
  std::string read_string(W&& what) {
    const size_t at = pos_;
    const uint64_t len = read<uint64_t>([&] { return describe(what) + " length"; });
    if (len > remaining() || len > kMaxStringBytes) {
      fail(describe(what) + " length " + std::to_string(len) + " exceeds the " +
               std::to_string(remaining()) + " bytes left in the file",
           at);
    }
    std::string s(reinterpret_cast<const char*>(base_ + pos_), static_cast<size_t>(len));
    pos_ += len;
    return s;
  }

 private:
  const uint8_t* base_;
  size_t size_;
  size_t pos_ = 0;
  const std::string& label_;
};

class MetadataParser {
 public:
  explicit MetadataParser(Cursor& c) : c_(c) {}

  // `key_of` names the value for errors only (built lazily: "tokens[1234]").
  template <typename K>
  GgufValue read_value(GgufValueType t, K&& key_of, int depth) {
    count_values(1, key_of);
    auto W = [&] { return "value of " + key_of(); };
    GgufValue v;
    v.type = t;
    switch (t) {
      case GgufValueType::UINT8: v.v = uint64_t{c_.read<uint8_t>(W)}; break;
      case GgufValueType::INT8: v.v = int64_t{c_.read<int8_t>(W)}; break;
      case GgufValueType::UINT16: v.v = uint64_t{c_.read<uint16_t>(W)}; break;
      case GgufValueType::INT16: v.v = int64_t{c_.read<int16_t>(W)}; break;
      case GgufValueType::UINT32: v.v = uint64_t{c_.read<uint32_t>(W)}; break;
      case GgufValueType::INT32: v.v = int64_t{c_.read<int32_t>(W)}; break;
      case GgufValueType::UINT64: v.v = c_.read<uint64_t>(W); break;
      case GgufValueType::INT64: v.v = c_.read<int64_t>(W); break;
      case GgufValueType::FLOAT32: v.v = static_cast<double>(c_.read<float>(W)); break;
      case GgufValueType::FLOAT64: v.v = c_.read<double>(W); break;
      case GgufValueType::BOOL: {
        const size_t at = c_.pos();
        const uint8_t b = c_.read<uint8_t>(W);
        if (b > 1)
          c_.fail("bool value of " + key_of() + " is " + std::to_string(b) + ", not 0 or 1", at);
        v.v = b != 0;
        break;
      }
      case GgufValueType::STRING:
        v.v = c_.read_string([&] { return "string value of " + key_of(); });
        break;
      case GgufValueType::ARRAY: v.v = read_array(key_of(), depth + 1); break;
      default:
        c_.fail("metadata key " + key_of() + " has unknown value type " +
                std::to_string(static_cast<uint32_t>(t)));
    }
    return v;
  }

  GgufValueType read_type(const std::string& what) {
    const size_t at = c_.pos();
    const uint32_t t = c_.read<uint32_t>(what);
    if (t > static_cast<uint32_t>(GgufValueType::FLOAT64)) {
      c_.fail(what + " " + std::to_string(t) + " is not a GGUF value type (0..12)", at);
    }
    return static_cast<GgufValueType>(t);
  }

 private:
  std::shared_ptr<GgufArray> read_array(const std::string& key, int depth) {
    if (depth > kMaxArrayDepth) {
      c_.fail("metadata key " + key + ": arrays nested deeper than " +
              std::to_string(kMaxArrayDepth) + " levels");
    }
    auto arr = std::make_shared<GgufArray>();
    arr->elem_type = read_type("element type of array " + key);
    const size_t at = c_.pos();
    const uint64_t n = c_.read<uint64_t>("element count of array " + key);
    const size_t min = min_value_size(arr->elem_type);
    if (n > c_.remaining() / min) {
      c_.fail("array " + key + " claims " + std::to_string(n) + " elements of type " +
                  type_name(arr->elem_type) + ", more than the " + std::to_string(c_.remaining()) +
                  " bytes left can hold",
              at);
    }
    if (n > kMaxMetadataValues - values_) {
      c_.fail("array " + key + " has " + std::to_string(n) + " elements; more than " +
                  std::to_string(kMaxMetadataValues) + " metadata values in total",
              at);
    }
    arr->items.reserve(static_cast<size_t>(n));
    for (uint64_t i = 0; i < n; ++i) {
      arr->items.push_back(read_value(
          arr->elem_type, [&] { return key + "[" + std::to_string(i) + "]"; }, depth));
    }
    return arr;
  }

  template <typename K>
  void count_values(uint64_t n, K&& key_of) {
    if (n > kMaxMetadataValues - values_) {
      c_.fail("metadata key " + key_of() + ": more than " + std::to_string(kMaxMetadataValues) +
              " metadata values in total");
    }
    values_ += n;
  }

  Cursor& c_;
  uint64_t values_ = 0;
};

std::string shape_str(const std::vector<int64_t>& ne) {
  std::string s = "[";
  for (size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "]";
}

}  // namespace

// ---- GgufValue ----

uint64_t GgufValue::as_u64() const {
  if (auto* u = std::get_if<uint64_t>(&v)) return *u;
  if (auto* i = std::get_if<int64_t>(&v); i && *i >= 0) return static_cast<uint64_t>(*i);
  throw GgufError("metadata value of type " + type_name(type) + " is not a non-negative integer");
}

int64_t GgufValue::as_i64() const {
  if (auto* i = std::get_if<int64_t>(&v)) return *i;
  if (auto* u = std::get_if<uint64_t>(&v);
      u && *u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return static_cast<int64_t>(*u);
  }
  throw GgufError("metadata value of type " + type_name(type) + " is not an int64");
}

double GgufValue::as_f64() const {
  if (auto* d = std::get_if<double>(&v)) return *d;
  if (auto* u = std::get_if<uint64_t>(&v)) return static_cast<double>(*u);
  if (auto* i = std::get_if<int64_t>(&v)) return static_cast<double>(*i);
  throw GgufError("metadata value of type " + type_name(type) + " is not a number");
}

bool GgufValue::as_bool() const {
  if (auto* b = std::get_if<bool>(&v)) return *b;
  throw GgufError("metadata value of type " + type_name(type) + " is not a bool");
}

const std::string& GgufValue::as_string() const {
  if (auto* s = std::get_if<std::string>(&v)) return *s;
  throw GgufError("metadata value of type " + type_name(type) + " is not a string");
}

const GgufArray& GgufValue::as_array() const {
  if (auto* a = std::get_if<std::shared_ptr<GgufArray>>(&v)) return **a;
  throw GgufError("metadata value of type " + type_name(type) + " is not an array");
}

// ---- TensorInfo ----

int64_t TensorInfo::n_elements() const {
  int64_t n = 1;
  for (int64_t d : ne) n *= d;
  return n;
}

int64_t TensorInfo::rows() const {
  int64_t n = 1;
  for (size_t i = 1; i < ne.size(); ++i) n *= ne[i];
  return n;
}

// ---- GgufFile ----

std::shared_ptr<GgufFile> GgufFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    throw GgufError(path + ": cannot open: " + std::strerror(errno));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    throw GgufError(path + ": cannot stat: " + std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw GgufError(path + ": not a regular file");
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size < 24) {
    ::close(fd);
    throw GgufError(path + ": file is " + std::to_string(size) +
                    " bytes, too small for a GGUF header (24 bytes)");
  }
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int e = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (p == MAP_FAILED) throw GgufError(path + ": mmap failed: " + std::strerror(e));

  std::shared_ptr<GgufFile> f(new GgufFile());  // private constructor: no make_shared
  f->path_ = path;
  f->base_ = static_cast<const uint8_t*>(p);
  f->size_ = size;
  f->mapped_ = true;
  f->parse();
  return f;
}

std::shared_ptr<GgufFile> GgufFile::from_memory(const uint8_t* data, size_t size,
                                                std::string label) {
  std::shared_ptr<GgufFile> f(new GgufFile());
  f->path_ = std::move(label);
  f->base_ = data;
  f->size_ = size;
  f->parse();
  return f;
}

GgufFile::~GgufFile() {
  if (mapped_ && base_) ::munmap(const_cast<uint8_t*>(base_), size_);
}

void GgufFile::parse() {
  Cursor c(base_, size_, path_);
  const uint32_t magic = c.read<uint32_t>("magic");
  if (magic != kGgufMagic) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "bad magic 0x%08x, expected 0x%08x (\"GGUF\")", magic,
                  kGgufMagic);
    c.fail(buf, 0);
  }
  version_ = c.read<uint32_t>("version");
  if (version_ != 3) {
    std::string hint;
    if (version_ == 0x03000000u) hint = " (a big-endian file; only little-endian is supported)";
    c.fail("unsupported GGUF version " + std::to_string(version_) +
               ", only version 3 is supported" + hint,
           4);
  }
  const uint64_t n_tensors = c.read<uint64_t>("tensor count");
  if (n_tensors >= kMaxTensors) {
    c.fail("tensor count " + std::to_string(n_tensors) + " exceeds the limit of " +
               std::to_string(kMaxTensors - 1),
           8);
  }
  const uint64_t n_kv = c.read<uint64_t>("metadata count");
  // A key-value pair takes at least 8 (key length) + 4 (type) + 1 (value) bytes.
  if (n_kv > c.remaining() / 13) {
    c.fail("metadata count " + std::to_string(n_kv) + " is more than the " +
               std::to_string(c.remaining()) + " bytes left can hold",
           16);
  }

  MetadataParser mp(c);
  for (uint64_t i = 0; i < n_kv; ++i) {
    const size_t at = c.pos();
    std::string key = c.read_string("key of metadata entry " + std::to_string(i));
    if (key.empty()) c.fail("metadata entry " + std::to_string(i) + " has an empty key", at);
    const GgufValueType t = mp.read_type("value type of metadata key " + key);
    GgufValue v = mp.read_value(
        t, [&] { return key; }, 0);
    if (!kv_.emplace(key, std::move(v)).second) c.fail("duplicate metadata key " + key, at);
  }

  if (const GgufValue* a = find("general.alignment")) {
    if (a->type != GgufValueType::UINT32) {
      throw GgufError(path_ + ": general.alignment has type " + type_name(a->type) +
                      ", expected UINT32");
    }
    const uint64_t al = a->as_u64();
    if (al == 0 || (al & (al - 1)) != 0) {
      throw GgufError(path_ + ": general.alignment " + std::to_string(al) +
                      " is not a power of two");
    }
    alignment_ = static_cast<size_t>(al);
  }

  // Each tensor info takes at least 8 (name length) + 4 (n_dims) + 8 (one dim) + 4 (type)
  // + 8 (offset) bytes.
  if (n_tensors > c.remaining() / 32) {
    c.fail("tensor count " + std::to_string(n_tensors) + " is more than the " +
           std::to_string(c.remaining()) + " bytes left can hold");
  }
  tensors_.reserve(static_cast<size_t>(n_tensors));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    TensorInfo ti;
    const size_t at = c.pos();
    ti.name = c.read_string("name of tensor " + std::to_string(i));
    const std::string what = "tensor '" + ti.name + "'";
    const size_t dims_at = c.pos();
    const uint32_t n_dims = c.read<uint32_t>("dimension count of " + what);
    if (n_dims == 0 || n_dims > kMaxDims) {
      c.fail(what + " has " + std::to_string(n_dims) + " dimensions, expected 1 to 4", dims_at);
    }
    int64_t n_el = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const size_t dat = c.pos();
      const uint64_t dim = c.read<uint64_t>("dimension " + std::to_string(d) + " of " + what);
      if (dim == 0 || dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        c.fail(what + " dimension " + std::to_string(d) + " is " + std::to_string(dim) +
                   ", expected 1 to 2^63-1",
               dat);
      }
      const auto sd = static_cast<int64_t>(dim);
      if (n_el > std::numeric_limits<int64_t>::max() / sd) {
        c.fail(what + " element count overflows int64", dat);
      }
      n_el *= sd;
      ti.ne.push_back(sd);
    }
    const size_t type_at = c.pos();
    ti.type_raw = c.read<uint32_t>("type of " + what);
    const auto bs = ggml_block_size(ti.type_raw);
    const auto bb = ggml_type_block_bytes(ti.type_raw);
    if (!bs || !bb) {
      c.fail(what + " has unknown tensor type " + std::to_string(ti.type_raw), type_at);
    }
    ti.type = static_cast<GgmlType>(ti.type_raw);
    if (ti.ne[0] % static_cast<int64_t>(*bs) != 0) {
      c.fail(what + " of type " + std::string(ggml_type_name(ti.type_raw)) + " has rows of " +
                 std::to_string(ti.ne[0]) + " elements, not a multiple of the block size " +
                 std::to_string(*bs),
             type_at);
    }
    const uint64_t blocks = static_cast<uint64_t>(n_el) / *bs;
    if (blocks > std::numeric_limits<uint64_t>::max() / *bb) {
      c.fail(what + " byte size overflows", type_at);
    }
    const uint64_t nbytes = blocks * *bb;
    if (nbytes > size_) {
      c.fail(what + " of shape " + shape_str(ti.ne) + " and type " +
                 std::string(ggml_type_name(ti.type_raw)) + " needs " + std::to_string(nbytes) +
                 " bytes, more than the whole file (" + std::to_string(size_) + " bytes)",
             type_at);
    }
    ti.nbytes = static_cast<size_t>(nbytes);
    const size_t off_at = c.pos();
    ti.offset = c.read<uint64_t>("data offset of " + what);
    if (ti.offset % alignment_ != 0) {
      c.fail(what + " data offset " + std::to_string(ti.offset) + " is not a multiple of the " +
                 "alignment " + std::to_string(alignment_),
             off_at);
    }
    if (!tensor_index_.emplace(ti.name, tensors_.size()).second) {
      c.fail("duplicate tensor name '" + ti.name + "'", at);
    }
    tensors_.push_back(std::move(ti));
  }

  // The data section starts at the next multiple of the alignment.
  const size_t end_infos = c.pos();
  const size_t pad = (alignment_ - end_infos % alignment_) % alignment_;
  if (n_tensors > 0 && pad > size_ - end_infos) {
    c.fail("file truncated before the data section: need " + std::to_string(pad) +
           " bytes of padding");
  }
  data_offset_ = std::min(end_infos + pad, size_);
  const size_t data_size = size_ - data_offset_;

  for (auto& ti : tensors_) {
    if (ti.offset > data_size || ti.nbytes > data_size - ti.offset) {
      throw GgufError(path_ + ": tensor '" + ti.name + "' data [" + std::to_string(ti.offset) +
                      ", " + std::to_string(ti.offset + ti.nbytes) +
                      ") lies past the end of the data section (" + std::to_string(data_size) +
                      " bytes from file offset " + std::to_string(data_offset_) + ")");
    }
    ti.data = base_ + data_offset_ + ti.offset;
  }
  // Overlap check over the tensors sorted by offset; O(n log n) on at most 10k tensors.
  std::vector<const TensorInfo*> by_off;
  by_off.reserve(tensors_.size());
  for (const auto& ti : tensors_) by_off.push_back(&ti);
  std::sort(by_off.begin(), by_off.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_off.size(); ++i) {
    const TensorInfo* prev = by_off[i - 1];
    if (by_off[i]->offset < prev->offset + prev->nbytes) {
      throw GgufError(path_ + ": tensor '" + by_off[i]->name + "' data at offset " +
                      std::to_string(by_off[i]->offset) + " overlaps tensor '" + prev->name +
                      "' at [" + std::to_string(prev->offset) + ", " +
                      std::to_string(prev->offset + prev->nbytes) + ")");
    }
  }
}

const GgufValue* GgufFile::find(std::string_view key) const {
  auto it = kv_.find(std::string(key));
  return it == kv_.end() ? nullptr : &it->second;
}

namespace {
template <typename F>
auto typed(const GgufFile& f, std::string_view key, F&& get) {
  const GgufValue* v = f.find(key);
  if (!v) throw GgufError(f.path() + ": missing key " + std::string(key));
  try {
    return get(*v);
  } catch (const GgufError& e) {
    throw GgufError(f.path() + ": key " + std::string(key) + ": " + e.what());
  }
}
}  // namespace

std::string GgufFile::get_string(std::string_view key) const {
  return typed(*this, key, [](const GgufValue& v) { return v.as_string(); });
}
std::string GgufFile::get_string(std::string_view key, std::string_view fallback) const {
  return find(key) ? get_string(key) : std::string(fallback);
}
uint64_t GgufFile::get_u64(std::string_view key) const {
  return typed(*this, key, [](const GgufValue& v) { return v.as_u64(); });
}
uint64_t GgufFile::get_u64(std::string_view key, uint64_t fallback) const {
  return find(key) ? get_u64(key) : fallback;
}
double GgufFile::get_f64(std::string_view key) const {
  return typed(*this, key, [](const GgufValue& v) { return v.as_f64(); });
}
double GgufFile::get_f64(std::string_view key, double fallback) const {
  return find(key) ? get_f64(key) : fallback;
}
bool GgufFile::get_bool(std::string_view key, bool fallback) const {
  return find(key) ? typed(*this, key, [](const GgufValue& v) { return v.as_bool(); }) : fallback;
}
std::vector<std::string> GgufFile::get_string_array(std::string_view key) const {
  return typed(*this, key, [](const GgufValue& v) {
    std::vector<std::string> out;
    const auto& a = v.as_array();
    out.reserve(a.items.size());
    for (const auto& it : a.items) out.push_back(it.as_string());
    return out;
  });
}
std::vector<int64_t> GgufFile::get_int_array(std::string_view key) const {
  return typed(*this, key, [](const GgufValue& v) {
    std::vector<int64_t> out;
    const auto& a = v.as_array();
    out.reserve(a.items.size());
    for (const auto& it : a.items) out.push_back(it.as_i64());
    return out;
  });
}
std::vector<double> GgufFile::get_float_array(std::string_view key) const {
  return typed(*this, key, [](const GgufValue& v) {
    std::vector<double> out;
    const auto& a = v.as_array();
    out.reserve(a.items.size());
    for (const auto& it : a.items) out.push_back(it.as_f64());
    return out;
  });
}

const TensorInfo* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const TensorInfo& GgufFile::tensor(std::string_view name) const {
  const TensorInfo* t = find_tensor(name);
  if (!t) throw GgufError(path_ + ": missing tensor '" + std::string(name) + "'");
  return *t;
}

}  // namespace worker
