#include "proto/grpc_tls.h"

#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/auth.h"

namespace mc {

namespace {

constexpr size_t kMaxPemBytes = 1 << 20;

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct PkeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using BioPtr = std::unique_ptr<BIO, BioFree>;
using X509Ptr = std::unique_ptr<X509, X509Free>;
using PkeyPtr = std::unique_ptr<EVP_PKEY, PkeyFree>;

// A certificate or CA file: anyone may read it, but it must be a regular file of sane size.
absl::StatusOr<std::string> ReadPublicFile(const std::string& path) {
  return auth::ReadRegularFile(path, kMaxPemBytes, /*private_only=*/false);
}

absl::StatusOr<std::string> ReadKeyFile(const std::string& path) {
  absl::StatusOr<std::string> key = auth::ReadPrivateFile(path);  // trimmed
  if (!key.ok()) return key.status();
  return *key + "\n";
}

// The certificates of a PEM bundle, in order; an error when there are none.
absl::StatusOr<std::vector<X509Ptr>> ParseCertificates(const std::string& path,
                                                       const std::string& pem) {
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  std::vector<X509Ptr> certs;
  while (X509* x = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) certs.emplace_back(x);
  ERR_clear_error();  // the loop ends on a "no start line" error
  if (certs.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(path, " holds no PEM certificate"));
  }
  return certs;
}

class Checker {
 public:
  explicit Checker(std::vector<std::string>& problems) : problems_(problems) {}
  void operator()(bool ok, std::string problem) {
    if (!ok) problems_.push_back(std::move(problem));
  }
  // The value, or "" after recording `flag: <error>`.
  template <typename T>
  std::optional<T> Take(const std::string& flag, absl::StatusOr<T> v) {
    if (v.ok()) return std::move(*v);
    problems_.push_back(absl::StrCat(flag, ": ", v.status().message()));
    return std::nullopt;
  }

 private:
  std::vector<std::string>& problems_;
};

// Checks a certificate chain file and its key file (both named).
void CheckPair(const std::string& cert_file, const std::string& key_file, const TlsFlagNames& names,
               Checker& check) {
  std::optional<std::string> cert_pem = check.Take(names.cert, ReadPublicFile(cert_file));
  std::optional<std::string> key_pem = check.Take(names.key, ReadKeyFile(key_file));
  std::optional<std::vector<X509Ptr>> certs;
  if (cert_pem) certs = check.Take(names.cert, ParseCertificates(cert_file, *cert_pem));
  if (certs) {
    X509* leaf = (*certs)[0].get();
    check(X509_cmp_current_time(X509_get0_notAfter(leaf)) > 0,
          absl::StrCat(names.cert, ": the certificate in ", cert_file, " has expired"));
    check(X509_cmp_current_time(X509_get0_notBefore(leaf)) < 0,
          absl::StrCat(names.cert, ": the certificate in ", cert_file,
                       " is not valid yet (check the clock)"));
  }
  if (!key_pem) return;
  BioPtr bio(BIO_new_mem_buf(key_pem->data(), static_cast<int>(key_pem->size())));
  PkeyPtr key(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  ERR_clear_error();
  if (key == nullptr) {
    check(false, absl::StrCat(names.key, ": ", key_file,
                              " holds no PEM private key (an encrypted key is not supported)"));
    return;
  }
  if (certs) {
    check(X509_check_private_key((*certs)[0].get(), key.get()) == 1,
          absl::StrCat(names.key, ": ", key_file, " is not the key of the certificate in ",
                       cert_file));
    ERR_clear_error();
  }
}

void CheckCa(const std::string& ca_file, const std::string& flag, Checker& check) {
  std::optional<std::string> pem = check.Take(flag, ReadPublicFile(ca_file));
  if (pem) check.Take(flag, ParseCertificates(ca_file, *pem));
}

}  // namespace

std::vector<std::string> TlsServerProblems(const TlsServerFiles& files, const TlsFlagNames& names) {
  std::vector<std::string> problems;
  Checker check(problems);
  if (!files.enabled()) {
    check(files.client_ca_file.empty(),
          absl::StrCat(names.ca, " needs ", names.cert, " and ", names.key));
    return problems;
  }
  if (files.cert_file.empty() || files.key_file.empty()) {
    check(false, absl::StrCat(names.cert, " and ", names.key, " go together"));
    return problems;
  }
  CheckPair(files.cert_file, files.key_file, names, check);
  if (!files.client_ca_file.empty()) CheckCa(files.client_ca_file, names.ca, check);
  return problems;
}

std::vector<std::string> TlsChannelProblems(const TlsChannelFiles& files,
                                            const TlsFlagNames& names) {
  std::vector<std::string> problems;
  Checker check(problems);
  const bool pair = !files.cert_file.empty() || !files.key_file.empty();
  if (!files.enabled()) {
    check(!pair, absl::StrCat(names.cert, " and ", names.key, " need ", names.ca,
                              " (TLS towards the server is off without it)"));
    check(files.server_name.empty(), absl::StrCat(names.server_name, " needs ", names.ca));
    return problems;
  }
  CheckCa(files.ca_file, names.ca, check);
  if (pair) {
    if (files.cert_file.empty() || files.key_file.empty()) {
      check(false, absl::StrCat(names.cert, " and ", names.key, " go together"));
    } else {
      CheckPair(files.cert_file, files.key_file, names, check);
    }
  }
  return problems;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsServerFiles& files, const TlsFlagNames& names) {
  if (!files.enabled()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions opts(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  absl::StatusOr<std::string> cert = ReadPublicFile(files.cert_file);
  if (!cert.ok())
    return absl::InvalidArgumentError(absl::StrCat(names.cert, ": ", cert.status().message()));
  absl::StatusOr<std::string> key = ReadKeyFile(files.key_file);
  if (!key.ok())
    return absl::InvalidArgumentError(absl::StrCat(names.key, ": ", key.status().message()));
  pair.cert_chain = std::move(*cert);
  pair.private_key = std::move(*key);
  opts.pem_key_cert_pairs.push_back(std::move(pair));
  if (!files.client_ca_file.empty()) {
    absl::StatusOr<std::string> ca = ReadPublicFile(files.client_ca_file);
    if (!ca.ok())
      return absl::InvalidArgumentError(absl::StrCat(names.ca, ": ", ca.status().message()));
    opts.pem_root_certs = std::move(*ca);
    opts.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(opts);
}

ChannelSecurity::ChannelSecurity() : credentials_(grpc::InsecureChannelCredentials()) {}

absl::StatusOr<ChannelSecurity> ChannelSecurity::Make(const TlsChannelFiles& files,
                                                      const TlsFlagNames& names) {
  ChannelSecurity out;
  if (!files.enabled()) return out;
  grpc::SslCredentialsOptions opts;
  absl::StatusOr<std::string> ca = ReadPublicFile(files.ca_file);
  if (!ca.ok())
    return absl::InvalidArgumentError(absl::StrCat(names.ca, ": ", ca.status().message()));
  opts.pem_root_certs = std::move(*ca);
  if (!files.cert_file.empty()) {
    absl::StatusOr<std::string> cert = ReadPublicFile(files.cert_file);
    if (!cert.ok())
      return absl::InvalidArgumentError(absl::StrCat(names.cert, ": ", cert.status().message()));
    absl::StatusOr<std::string> key = ReadKeyFile(files.key_file);
    if (!key.ok())
      return absl::InvalidArgumentError(absl::StrCat(names.key, ": ", key.status().message()));
    opts.pem_cert_chain = std::move(*cert);
    opts.pem_private_key = std::move(*key);
  }
  out.tls_ = true;
  out.credentials_ = grpc::SslCredentials(opts);
  out.server_name_ = files.server_name;
  out.files_ = files;
  return out;
}

std::shared_ptr<grpc::ChannelCredentials> ChannelSecurity::CredentialsFor(
    const std::string& target) const {
  if (absl::StartsWith(target, "unix:")) return grpc::InsecureChannelCredentials();
  return credentials_;
}

void ChannelSecurity::ApplyTo(grpc::ChannelArguments& args) const {
  if (tls_ && !server_name_.empty()) args.SetSslTargetNameOverride(server_name_);
}

std::shared_ptr<grpc::Channel> ChannelSecurity::CreateChannel(const std::string& target,
                                                              grpc::ChannelArguments args) const {
  ApplyTo(args);
  return grpc::CreateCustomChannel(target, CredentialsFor(target), args);
}

}  // namespace mc
