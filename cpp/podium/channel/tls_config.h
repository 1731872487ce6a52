// podium::channel::TlsConfig — what a Net needs to run its TCP connections over mutual
// TLS 1.3 (CH-9, docs/channel.md). Part of channel::Config; OpenSSL stays out of this header.
#pragma once

#include <string>

#include "podium/base/error.h"

namespace podium::channel {

// PEM text, not file names (load_tls_files() reads files). TLS is on when any field is set;
// then all three must be, or the Net refuses TCP (listen() fails, sends are handed back).
struct TlsConfig {
  // This process's certificate, followed by any intermediate certificates of its chain.
  std::string cert_pem;
  // The private key of that certificate. May be the same text as cert_pem (one PEM file
  // holding the key and the chain): each is read from the blocks of its own type.
  std::string key_pem;
  // The certificate(s) of the CA(s) that every peer's certificate must chain to.
  std::string ca_pem;

  bool enabled() const { return !cert_pem.empty() || !key_pem.empty() || !ca_pem.empty(); }
};

// Reads the three PEM files (the same path may be given for the certificate and the key).
[[nodiscard]] Result<TlsConfig> load_tls_files(const std::string& cert_path,
                                               const std::string& key_path,
                                               const std::string& ca_path);

// Parses `config` the way a Net will: a certificate, a key that matches it, at least one CA
// certificate. The error names what is wrong ("the private key does not match the
// certificate").
[[nodiscard]] Status check_tls_config(const TlsConfig& config);

}  // namespace podium::channel
