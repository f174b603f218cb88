// The TLS file checks (proto/grpc_tls.h) and how the daemons' options Validate() reports them:
// every problem named with its flag, found at start. Certificates are made in-process
// (tests/fakes/test_certs.h) in a temp dir.
#include "proto/grpc_tls.h"

#include <gmock/gmock.h>
#include <grpcpp/security/server_credentials.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "client/client_options.h"
#include "master/master_server.h"
#include "tests/fakes/test_certs.h"

namespace mc {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

class TlsFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/mc-tls-unit-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // NAME.pem and NAME.key (mode 0600): a self-signed certificate valid from two minutes ago
  // for `valid_s` seconds from now (negative: expired).
  void MakeCert(const std::string& name, long valid_s = 3600) {
    ASSERT_TRUE(tls_test::WriteSelfSignedCert(dir_, name, valid_s));
  }
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }
  void Write(const std::string& name, const std::string& content, mode_t mode) {
    std::ofstream(Path(name)) << content;
    chmod(Path(name).c_str(), mode);
  }
  TlsServerFiles Server(const std::string& name) const {
    return {.cert_file = Path(name + ".pem"), .key_file = Path(name + ".key")};
  }

  std::string dir_;
};

TEST_F(TlsFilesTest, ServerWithoutFilesIsOffAndFine) {
  EXPECT_THAT(TlsServerProblems({}), IsEmpty());
  EXPECT_FALSE(TlsServerFiles{}.enabled());
}

TEST_F(TlsFilesTest, GoodServerPairWithClientCaHasNoProblemAndMakesCredentials) {
  MakeCert("server");
  MakeCert("ca");
  TlsServerFiles files = Server("server");
  files.client_ca_file = Path("ca.pem");
  EXPECT_THAT(TlsServerProblems(files), IsEmpty());
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> creds = MakeServerCredentials(files);
  ASSERT_TRUE(creds.ok()) << creds.status();
  EXPECT_NE(*creds, nullptr);
}

TEST_F(TlsFilesTest, CertificateWithoutKeyIsNamed) {
  MakeCert("server");
  EXPECT_THAT(TlsServerProblems({.cert_file = Path("server.pem")}),
              ElementsAre(HasSubstr("--tls_cert_file and --tls_key_file go together")));
  EXPECT_THAT(TlsServerProblems({.key_file = Path("server.key")}),
              ElementsAre(HasSubstr("go together")));
}

TEST_F(TlsFilesTest, ClientCaWithoutCertificateIsNamed) {
  MakeCert("ca");
  EXPECT_THAT(TlsServerProblems({.client_ca_file = Path("ca.pem")}),
              ElementsAre(HasSubstr("--tls_client_ca_file needs --tls_cert_file")));
}

TEST_F(TlsFilesTest, KeyReadableByOthersIsRefusedWithTheFix) {
  MakeCert("server");
  chmod(Path("server.key").c_str(), 0640);
  EXPECT_THAT(TlsServerProblems(Server("server")),
              ElementsAre(AllOf(HasSubstr("--tls_key_file"), HasSubstr("chmod 600"))));
}

TEST_F(TlsFilesTest, MissingAndNonPemFilesAreNamed) {
  MakeCert("server");
  Write("junk.pem", "not a certificate\n", 0644);
  TlsServerFiles files = Server("server");
  files.cert_file = Path("junk.pem");
  files.client_ca_file = Path("absent.pem");
  EXPECT_THAT(
      TlsServerProblems(files),
      ElementsAre(AllOf(HasSubstr("--tls_cert_file"), HasSubstr("holds no PEM certificate")),
                  AllOf(HasSubstr("--tls_client_ca_file"), HasSubstr("cannot open"))));
  files = Server("server");
  files.key_file = dir_;  // a directory
  EXPECT_THAT(TlsServerProblems(files), ElementsAre(HasSubstr("--tls_key_file")));
}

TEST_F(TlsFilesTest, KeyOfAnotherCertificateIsNamed) {
  MakeCert("server");
  MakeCert("other");
  TlsServerFiles files = Server("server");
  files.key_file = Path("other.key");
  EXPECT_THAT(TlsServerProblems(files),
              ElementsAre(HasSubstr("is not the key of the certificate")));
}

TEST_F(TlsFilesTest, ExpiredCertificateIsNamed) {
  MakeCert("old", -60);
  EXPECT_THAT(TlsServerProblems(Server("old")), ElementsAre(HasSubstr("has expired")));
}

TEST_F(TlsFilesTest, ChannelFilesNeedTheCa) {
  MakeCert("client");
  const TlsFlagNames names{.ca = "--tls_ca_file"};
  EXPECT_THAT(TlsChannelProblems({}, names), IsEmpty());
  EXPECT_THAT(
      TlsChannelProblems(
          {.cert_file = Path("client.pem"), .key_file = Path("client.key"), .server_name = "x"},
          names),
      ElementsAre(HasSubstr("need --tls_ca_file"), HasSubstr("--tls_server_name needs")));
  EXPECT_THAT(
      TlsChannelProblems({.ca_file = Path("client.pem"), .cert_file = Path("client.pem")}, names),
      ElementsAre(HasSubstr("go together")));
  TlsChannelFiles good{.ca_file = Path("client.pem"),
                       .cert_file = Path("client.pem"),
                       .key_file = Path("client.key"),
                       .server_name = "localhost"};
  EXPECT_THAT(TlsChannelProblems(good, names), IsEmpty());
  absl::StatusOr<ChannelSecurity> security = ChannelSecurity::Make(good, names);
  ASSERT_TRUE(security.ok()) << security.status();
  EXPECT_TRUE(security->tls());
  EXPECT_FALSE(ChannelSecurity().tls());
}

TEST_F(TlsFilesTest, ClientOptionsNameTlsProblems) {
  MakeCert("server");
  client::ClientServerOptions o;
  o.tls = Server("server");  // neither --listen nor a TLS master: serves nothing
  EXPECT_THAT(o.Validate(), ElementsAre(HasSubstr("--tls_cert_file serves the TCP Store")));
  o.master_tls.ca_file = Path("server.pem");
  EXPECT_THAT(o.Validate(), IsEmpty());
  o.tls.client_ca_file = Path("server.pem");
  EXPECT_THAT(o.Validate(), ElementsAre(HasSubstr("--tls_client_ca_file needs --listen")));
  o.listen = "127.0.0.1:0";
  o.store_token = std::string(40, 't');
  EXPECT_THAT(o.Validate(), IsEmpty());
  o.master_tls = {.ca_file = Path("absent.pem"), .server_name = "m"};
  EXPECT_THAT(o.Validate(),
              ElementsAre(AllOf(HasSubstr("--master_tls_ca_file"), HasSubstr("cannot open"))));
}

TEST_F(TlsFilesTest, MasterOptionsNameTlsProblems) {
  MakeCert("server");
  master::MasterServerOptions o;
  o.tls.cert_file = Path("server.pem");
  EXPECT_THAT(o.Validate(), ElementsAre(HasSubstr("--tls_cert_file and --tls_key_file")));
  o.tls.key_file = Path("server.key");
  EXPECT_THAT(o.Validate(), IsEmpty());
}

}  // namespace
}  // namespace mc
