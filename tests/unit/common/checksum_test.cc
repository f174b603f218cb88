#include "common/checksum.h"

#include <gtest/gtest.h>

#include <string>

namespace mc {
namespace {

TEST(Checksum, StreamingEqualsOneShot) {
  std::string data(100000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 31 + 7);
  StreamingChecksum s;
  s.Update(data.data(), 1);
  s.Update(data.data() + 1, 4095);
  s.Update(data.data() + 4096, data.size() - 4096);
  EXPECT_EQ(s.Digest(), Checksum(data));
}

TEST(Checksum, OneFlippedByteChangesIt) {
  std::string a(4096, 'x');
  std::string b = a;
  b[1234] ^= 1;
  EXPECT_NE(Checksum(a), Checksum(b));
}

}  // namespace
}  // namespace mc
