// Throwaway certificates for the channel tests and channel_bench: a CA made at run time with
// OpenSSL (EC P-256, valid for a day), and certificates it signs. Not for production: the
// keys live in memory and nothing is stored.
#pragma once

#include <string>

#include "podium/channel/tls_config.h"

namespace podium::channel::testing {

class TestCa {
 public:
  // A self-signed CA certificate with `name` as its common name. Aborts on an OpenSSL error.
  explicit TestCa(const std::string& name);
  const std::string& cert_pem() const { return cert_pem_; }
  // A TlsConfig for one process: a certificate for `common_name` signed by this CA, its key,
  // and this CA as the one to trust.
  TlsConfig issue(const std::string& common_name) const;

 private:
  std::string cert_pem_;
  std::string key_pem_;
};

}  // namespace podium::channel::testing
