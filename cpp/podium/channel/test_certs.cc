#include "podium/channel/test_certs.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <cstdio>
#include <cstdlib>
#include <memory>

namespace podium::channel::testing {
namespace {

void check(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "test_certs: %s failed\n", what);
  ERR_print_errors_fp(stderr);
  std::abort();
}

struct Free {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
  void operator()(X509* x) const { X509_free(x); }
  void operator()(BIO* b) const { BIO_free(b); }
};
template <class T>
using Owned = std::unique_ptr<T, Free>;

Owned<EVP_PKEY> new_key() {
  Owned<EVP_PKEY> key(EVP_EC_gen("P-256"));
  check(key != nullptr, "EVP_EC_gen");
  return key;
}

std::string bio_text(BIO* b) {
  char* data = nullptr;
  long n = BIO_get_mem_data(b, &data);
  return std::string(data, size_t(n));
}

std::string pem_of(EVP_PKEY* key) {
  Owned<BIO> b(BIO_new(BIO_s_mem()));
  check(PEM_write_bio_PrivateKey(b.get(), key, nullptr, nullptr, 0, nullptr, nullptr) == 1,
        "PEM_write_bio_PrivateKey");
  return bio_text(b.get());
}

std::string pem_of(X509* cert) {
  Owned<BIO> b(BIO_new(BIO_s_mem()));
  check(PEM_write_bio_X509(b.get(), cert) == 1, "PEM_write_bio_X509");
  return bio_text(b.get());
}

void add_ext(X509* cert, X509* issuer, int nid, const char* value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
  check(ext != nullptr, "X509V3_EXT_conf_nid");
  check(X509_add_ext(cert, ext, -1) == 1, "X509_add_ext");
  X509_EXTENSION_free(ext);
}

// A certificate for `cn` and `key`, signed by `issuer` (itself when null) with `issuer_key`.
Owned<X509> make_cert(const std::string& cn, EVP_PKEY* key, X509* issuer, EVP_PKEY* issuer_key,
                      bool ca) {
  Owned<X509> cert(X509_new());
  check(cert != nullptr, "X509_new");
  X509_set_version(cert.get(), 2);
  unsigned char serial[16];
  check(RAND_bytes(serial, sizeof serial) == 1, "RAND_bytes");
  serial[0] &= 0x7f;  // a positive serial number
  BIGNUM* bn = BN_bin2bn(serial, sizeof serial, nullptr);
  check(bn && BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(cert.get())), "serial");
  BN_free(bn);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), 24 * 3600);
  X509_NAME* name = X509_get_subject_name(cert.get());
  check(X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                                   reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1,
                                   0) == 1,
        "X509_NAME_add_entry_by_txt");
  X509* signer = issuer ? issuer : cert.get();
  check(X509_set_issuer_name(cert.get(), X509_get_subject_name(signer)) == 1, "issuer");
  check(X509_set_pubkey(cert.get(), key) == 1, "X509_set_pubkey");
  add_ext(cert.get(), signer, NID_subject_key_identifier, "hash");
  if (ca) {
    add_ext(cert.get(), signer, NID_basic_constraints, "critical,CA:TRUE");
    add_ext(cert.get(), signer, NID_key_usage, "critical,keyCertSign,cRLSign");
  } else {
    add_ext(cert.get(), signer, NID_authority_key_identifier, "keyid");
    add_ext(cert.get(), signer, NID_basic_constraints, "critical,CA:FALSE");
    add_ext(cert.get(), signer, NID_key_usage, "critical,digitalSignature");
    add_ext(cert.get(), signer, NID_ext_key_usage, "serverAuth,clientAuth");
  }
  check(X509_sign(cert.get(), issuer_key ? issuer_key : key, EVP_sha256()) > 0, "X509_sign");
  return cert;
}

Owned<X509> read_cert(const std::string& pem) {
  Owned<BIO> b(BIO_new_mem_buf(pem.data(), int(pem.size())));
  Owned<X509> cert(PEM_read_bio_X509(b.get(), nullptr, nullptr, nullptr));
  check(cert != nullptr, "PEM_read_bio_X509");
  return cert;
}

Owned<EVP_PKEY> read_key(const std::string& pem) {
  Owned<BIO> b(BIO_new_mem_buf(pem.data(), int(pem.size())));
  Owned<EVP_PKEY> key(PEM_read_bio_PrivateKey(b.get(), nullptr, nullptr, nullptr));
  check(key != nullptr, "PEM_read_bio_PrivateKey");
  return key;
}

}  // namespace

TestCa::TestCa(const std::string& name) {
  auto key = new_key();
  auto cert = make_cert(name, key.get(), nullptr, nullptr, true);
  cert_pem_ = pem_of(cert.get());
  key_pem_ = pem_of(key.get());
}

TlsConfig TestCa::issue(const std::string& common_name) const {
  auto ca_cert = read_cert(cert_pem_);
  auto ca_key = read_key(key_pem_);
  auto key = new_key();
  auto cert = make_cert(common_name, key.get(), ca_cert.get(), ca_key.get(), false);
  TlsConfig c;
  c.cert_pem = pem_of(cert.get());
  c.key_pem = pem_of(key.get());
  c.ca_pem = cert_pem_;
  return c;
}

}  // namespace podium::channel::testing
