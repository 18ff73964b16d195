#include "common/sha256.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

namespace worker {
namespace {

constexpr std::array<uint32_t, 64> kK = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

constexpr uint32_t rotr(uint32_t x, int n) {
  return (x >> n) | (x << (32 - n));
}

constexpr size_t kPiece = size_t{16} << 20;

}  // namespace

Sha256::Sha256()
    : h_{0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
         0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19} {}

void Sha256::block(const uint8_t* p) {
  std::array<uint32_t, 64> w;
  for (int i = 0; i < 16; ++i)
    w[i] = (uint32_t{p[4 * i]} << 24) | (uint32_t{p[4 * i + 1]} << 16) |
           (uint32_t{p[4 * i + 2]} << 8) | uint32_t{p[4 * i + 3]};
  for (int i = 16; i < 64; ++i) {
    const uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
    const uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6], h = h_[7];
  for (int i = 0; i < 64; ++i) {
    const uint32_t t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) +
                        kK[static_cast<size_t>(i)] + w[static_cast<size_t>(i)];
    const uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
    h = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  h_[0] += a;
  h_[1] += b;
  h_[2] += c;
  h_[3] += d;
  h_[4] += e;
  h_[5] += f;
  h_[6] += g;
  h_[7] += h;
}

void Sha256::update(std::span<const uint8_t> data) {
  total_ += data.size();
  size_t i = 0;
  if (buf_len_ > 0) {
    const size_t take = std::min(data.size(), 64 - buf_len_);
    std::memcpy(buf_.data() + buf_len_, data.data(), take);
    buf_len_ += take;
    i = take;
    if (buf_len_ < 64) return;
    block(buf_.data());
    buf_len_ = 0;
  }
  for (; i + 64 <= data.size(); i += 64) block(data.data() + i);
  buf_len_ = data.size() - i;
  if (buf_len_) std::memcpy(buf_.data(), data.data() + i, buf_len_);
}

std::array<uint8_t, 32> Sha256::finish() {
  const uint64_t bits = total_ * 8;
  const uint8_t one = 0x80;
  update(&one, 1);
  const uint8_t zero = 0;
  while (buf_len_ != 56) update(&zero, 1);
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(bits >> (56 - 8 * i));
  update(len, 8);
  std::array<uint8_t, 32> out;
  for (size_t i = 0; i < 8; ++i)
    for (size_t j = 0; j < 4; ++j) out[4 * i + j] = static_cast<uint8_t>(h_[i] >> (24 - 8 * j));
  return out;
}

std::string to_hex(std::span<const uint8_t> bytes) {
  static const char* d = "0123456789abcdef";
  std::string s;
  s.reserve(bytes.size() * 2);
  for (uint8_t b : bytes) {
    s += d[b >> 4];
    s += d[b & 15];
  }
  return s;
}

std::string sha256_hex(std::span<const uint8_t> data) {
  Sha256 h;
  h.update(data);
  const auto d = h.finish();
  return to_hex(d);
}

std::string file_content_hash(const std::string& path, unsigned threads,
                              const std::function<bool(uint64_t, uint64_t)>& progress) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error("cannot open '" + path + "': " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw std::runtime_error("cannot stat '" + path + "'");
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  const size_t pieces = std::max<size_t>(1, static_cast<size_t>((size + kPiece - 1) / kPiece));
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency() - 1);
  threads = std::min<unsigned>(threads, static_cast<unsigned>(pieces));

  std::vector<std::array<uint8_t, 32>> digests(pieces);
  std::atomic<size_t> next{0};
  std::atomic<uint64_t> done{0};
  std::mutex err_mu, progress_mu;
  std::string error;
  auto work = [&] {
    std::vector<uint8_t> buf(size_t{1} << 20);
    for (size_t p; (p = next.fetch_add(1)) < pieces;) {
      Sha256 h;
      uint64_t off = p * kPiece;
      const uint64_t end = std::min<uint64_t>(size, off + kPiece);
      while (off < end) {
        const size_t want = static_cast<size_t>(std::min<uint64_t>(buf.size(), end - off));
        const ssize_t got = ::pread(fd, buf.data(), want, static_cast<off_t>(off));
        if (got <= 0) {
          if (got < 0 && errno == EINTR) continue;
          std::lock_guard lock(err_mu);
          error = "read of '" + path + "' failed at byte " + std::to_string(off);
          next.store(pieces);
          return;
        }
        h.update(buf.data(), static_cast<size_t>(got));
        off += static_cast<uint64_t>(got);
        const uint64_t d = done.fetch_add(static_cast<uint64_t>(got)) + static_cast<uint64_t>(got);
        if (progress) {
          std::lock_guard lock(progress_mu);
          if (!progress(d, size)) {
            std::lock_guard elock(err_mu);
            error = "hash of '" + path + "' abandoned";
            next.store(pieces);
            return;
          }
        }
      }
      digests[p] = h.finish();
    }
  };
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  ::close(fd);
  if (!error.empty()) throw std::runtime_error(error);
  Sha256 top;
  for (const auto& d : digests) top.update(d.data(), d.size());
  const auto root = top.finish();
  return "sha256-tree-16MiB:" + to_hex(root);
}

}  // namespace worker
