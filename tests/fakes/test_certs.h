// Certificates for tests of TLS (proto/grpc_tls.h), made in-process with OpenSSL: a self-signed
// P-256 certificate (its own CA) with a subjectAltName, written as NAME.pem and NAME.key (mode
// 0600) into a directory. Header-only; the test links OpenSSL::Crypto.
#pragma once

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>

#include <cstdio>
#include <string>

namespace mc::tls_test {

// False when OpenSSL failed (the test should ASSERT on it). `valid_s` < 0: already expired.
inline bool WriteSelfSignedCert(const std::string& dir, const std::string& name,
                                long valid_s = 3600,
                                const char* san = "IP:127.0.0.1,DNS:localhost") {
  EVP_PKEY* key = EVP_EC_gen("P-256");
  if (key == nullptr) return false;
  X509* x = X509_new();
  X509_set_version(x, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
  X509_gmtime_adj(X509_getm_notBefore(x), -120);
  X509_gmtime_adj(X509_getm_notAfter(x), valid_s);
  X509_set_pubkey(x, key);
  X509_NAME* subject = X509_get_subject_name(x);
  X509_NAME_add_entry_by_txt(subject, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(name.c_str()), -1, -1, 0);
  X509_set_issuer_name(x, subject);
  bool ok = true;
  if (san != nullptr) {
    X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, nullptr, NID_subject_alt_name, san);
    ok = ext != nullptr && X509_add_ext(x, ext, -1) == 1;
    X509_EXTENSION_free(ext);
  }
  ok = ok && X509_sign(x, key, EVP_sha256()) > 0;
  const std::string cert_path = dir + "/" + name + ".pem", key_path = dir + "/" + name + ".key";
  if (ok) {
    FILE* f = std::fopen(cert_path.c_str(), "w");
    ok = f != nullptr && PEM_write_X509(f, x) == 1;
    if (f != nullptr) std::fclose(f);
  }
  if (ok) {
    FILE* f = std::fopen(key_path.c_str(), "w");
    ok = f != nullptr && PEM_write_PrivateKey(f, key, nullptr, nullptr, 0, nullptr, nullptr) == 1;
    if (f != nullptr) std::fclose(f);
    ok = ok && chmod(key_path.c_str(), 0600) == 0;
  }
  X509_free(x);
  EVP_PKEY_free(key);
  return ok;
}

}  // namespace mc::tls_test
