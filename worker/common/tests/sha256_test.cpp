// SHA-256 against the FIPS 180-4 example vectors, and the receipts' model content hash
// (WRK-D18) against its definition computed piece by piece.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "common/sha256.h"

using namespace worker;

namespace {
std::string hex_of(const std::string& s) {
  return sha256_hex(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(s.data()), s.size()));
}
}  // namespace

// REQ: WRK-D18
TEST(Sha256, FipsVectors) {
  EXPECT_EQ(hex_of(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(hex_of("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(hex_of("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  Sha256 h;  // one million 'a', fed in uneven pieces
  const std::string a(999, 'a');
  size_t fed = 0;
  for (size_t n = 1; fed < 1000000; n = n % 997 + 1) {
    const size_t k = std::min(n, 1000000 - fed);
    h.update(a.data(), k);
    fed += k;
  }
  EXPECT_EQ(to_hex(h.finish()), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

// REQ: WRK-D18
TEST(Sha256, FileContentHashIsTheTreeOfPieceDigests) {
  const auto path =
      std::filesystem::temp_directory_path() / ("sha256_tree_" + std::to_string(getpid()));
  std::vector<uint8_t> data((size_t{33} << 20) + 12345);  // three pieces, the last short
  std::mt19937 g(5);
  for (auto& b : data) b = static_cast<uint8_t>(g());
  {
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
  }
  Sha256 top;
  for (size_t off = 0; off < data.size(); off += size_t{16} << 20) {
    Sha256 piece;
    piece.update(data.data() + off, std::min(size_t{16} << 20, data.size() - off));
    const auto d = piece.finish();
    top.update(d.data(), d.size());
  }
  const std::string want = "sha256-tree-16MiB:" + to_hex(top.finish());
  uint64_t last = 0;
  EXPECT_EQ(file_content_hash(path, 1), want);
  EXPECT_EQ(file_content_hash(path, 3,
                              [&](uint64_t done, uint64_t total) {
                                EXPECT_EQ(total, data.size());
                                last = std::max(last, done);
                                return true;
                              }),
            want);
  EXPECT_EQ(last, data.size());
  EXPECT_THROW(
      file_content_hash(path, 2, [](uint64_t done, uint64_t) { return done < (8u << 20); }),
      std::runtime_error);
  data[(size_t{20} << 20)] ^= 1;  // one bit of the second piece
  {
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
  }
  EXPECT_NE(file_content_hash(path), want);
  std::filesystem::remove(path);
  EXPECT_THROW(file_content_hash(path.string()), std::runtime_error);
}
