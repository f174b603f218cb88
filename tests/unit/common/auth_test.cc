// common/auth: secret files, per-purpose keys, MAC verification across a rotation.
#include "common/auth.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <set>
#include <string>

#include "gtest/gtest.h"

namespace mc::auth {
namespace {

const std::string kA(64, 'a');
const std::string kB(64, 'b');

class SecretFile {
 public:
  SecretFile(const std::string& content, mode_t mode) {
    char tmpl[] = "/tmp/mc-auth-test-XXXXXX";
    int fd = mkstemp(tmpl);
    path_ = tmpl;
    EXPECT_EQ(write(fd, content.data(), content.size()), static_cast<ssize_t>(content.size()));
    close(fd);
    chmod(path_.c_str(), mode);
  }
  ~SecretFile() { unlink(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(HmacTest, MatchesRfc4231Case2) {
  Mac mac = HmacSha256("Jefe", "what do ya want for nothing?");
  EXPECT_EQ(Hex(std::string_view(reinterpret_cast<const char*>(mac.data()), mac.size())),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

TEST(ClusterKeysTest, LoadsCommentsAndBlankLines) {
  SecretFile f("# cluster secret\n\n" + kA + "\n  " + kB + "  \n", 0600);
  auto keys = ClusterKeys::Load(f.path());
  ASSERT_TRUE(keys.ok()) << keys.status();
  EXPECT_EQ((*keys)->secret_count(), 2u);
  EXPECT_EQ((*keys)->fingerprint().size(), 12u);
}

TEST(ClusterKeysTest, RefusesAFileOthersCanRead) {
  SecretFile f(kA + "\n", 0644);
  auto keys = ClusterKeys::Load(f.path());
  ASSERT_FALSE(keys.ok());
  EXPECT_NE(keys.status().message().find("chmod 600"), std::string::npos) << keys.status();
  SecretFile g(kA + "\n", 0640);
  EXPECT_FALSE(ClusterKeys::Load(g.path()).ok());
}

TEST(ClusterKeysTest, RefusesMissingShortEmptyAndTooMany) {
  EXPECT_FALSE(ClusterKeys::Load("/nonexistent/mc-secret").ok());
  EXPECT_FALSE(ClusterKeys::Load("/tmp").ok());  // not a regular file
  SecretFile short_secret("tooshort\n", 0600);
  EXPECT_FALSE(ClusterKeys::Load(short_secret.path()).ok());
  SecretFile empty("# nothing\n\n", 0600);
  EXPECT_FALSE(ClusterKeys::Load(empty.path()).ok());
  std::string five;
  for (int i = 0; i < 5; ++i) five += std::string(40, static_cast<char>('c' + i)) + "\n";
  SecretFile too_many(five, 0600);
  EXPECT_FALSE(ClusterKeys::Load(too_many.path()).ok());
}

TEST(ClusterKeysTest, PurposesDoNotCrossVerify) {
  auto keys = *ClusterKeys::FromSecrets({kA});
  Mac m = keys->Sign(Purpose::kDataPlane, "hello");
  EXPECT_TRUE(keys->Verify(Purpose::kDataPlane, "hello", m.data(), m.size()));
  EXPECT_FALSE(keys->Verify(Purpose::kMasterRpc, "hello", m.data(), m.size()));
  EXPECT_FALSE(keys->Verify(Purpose::kCapability, "hello", m.data(), m.size()));
  EXPECT_FALSE(keys->Verify(Purpose::kDataPlane, "hellO", m.data(), m.size()));
  Mac bad = m;
  bad[31] ^= 1;
  EXPECT_FALSE(keys->Verify(Purpose::kDataPlane, "hello", bad.data(), bad.size()));
}

TEST(ClusterKeysTest, TruncatedMacsVerifyDownTo16Bytes) {
  auto keys = *ClusterKeys::FromSecrets({kA});
  Mac m = keys->Sign(Purpose::kCapability, "grant");
  EXPECT_TRUE(keys->Verify(Purpose::kCapability, "grant", m.data(), 16));
  EXPECT_FALSE(keys->Verify(Purpose::kCapability, "grant", m.data(), 15));
  EXPECT_FALSE(keys->Verify(Purpose::kCapability, "grant", m.data(), 0));
  EXPECT_FALSE(keys->Verify(Purpose::kCapability, "grant", nullptr, 16));
}

// Rotation: a daemon holding [new, old] accepts MACs of both; one holding only [old] does not
// accept the new secret's MACs.
TEST(ClusterKeysTest, RotationAcceptsEverySecretButSignsWithTheFirst) {
  auto old_only = *ClusterKeys::FromSecrets({kA});
  auto both = *ClusterKeys::FromSecrets({kB, kA});
  auto new_only = *ClusterKeys::FromSecrets({kB});
  Mac by_old = old_only->Sign(Purpose::kMasterRpc, "x");
  Mac by_both = both->Sign(Purpose::kMasterRpc, "x");
  EXPECT_TRUE(both->Verify(Purpose::kMasterRpc, "x", by_old.data(), by_old.size()));
  EXPECT_TRUE(new_only->Verify(Purpose::kMasterRpc, "x", by_both.data(), by_both.size()));
  EXPECT_FALSE(old_only->Verify(Purpose::kMasterRpc, "x", by_both.data(), by_both.size()));
  EXPECT_NE(old_only->fingerprint(), new_only->fingerprint());
  EXPECT_EQ(both->fingerprint(), new_only->fingerprint());
}

TEST(RandomTest, BytesDifferAndSecretsAreHex) {
  std::set<std::string> seen;
  for (int i = 0; i < 100; ++i) seen.insert(RandomBytes(16));
  EXPECT_EQ(seen.size(), 100u);
  std::string s = NewSecret();
  EXPECT_EQ(s.size(), 64u);
  EXPECT_EQ(s.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_TRUE(ClusterKeys::FromSecrets({s}).ok());
}

TEST(ConstantTimeEqualTest, ComparesBytes) {
  EXPECT_TRUE(ConstantTimeEqual("abc", "abc"));
  EXPECT_FALSE(ConstantTimeEqual("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEqual("abc", "abcd"));
  EXPECT_TRUE(ConstantTimeEqual("", ""));
}

}  // namespace
}  // namespace mc::auth
