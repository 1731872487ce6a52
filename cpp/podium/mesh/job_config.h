// Internal to podium_mesh: what a process of a job reads from its environment at start, the
// job's secret (channel CH-8) and TLS settings (CH-9), and the secret a controller makes for
// itself when it was given none (docs/security.md).
//
// Invariants:
//   SE-1 A controller started without PODIUM_SECRET / PODIUM_SECRET_FILE, and without
//        PODIUM_INSECURE=1, generates a random 256-bit secret, writes it to `secret` (mode
//        0600) in its 0700 socket directory and exports PODIUM_SECRET_FILE, so the procs it
//        spawns, and programs it starts, hold the same secret. The secret never appears on a
//        command line.
//   SE-2 A worker (host agent) refuses to start without a secret unless it was told to run
//        insecure; an insecure worker, and a controller on TCP with PODIUM_INSECURE=1, say so
//        on stderr when they start.
//   SE-3 Socket directories of controllers that have ended (their pid is gone) are removed by
//        the next controller of the same user that starts.
#pragma once

#include <string>

#include "podium/base/error.h"
#include "podium/channel/tls_config.h"

namespace podium::mesh::internal {

// PODIUM_SECRET, or the contents of the file PODIUM_SECRET_FILE names (a trailing newline
// dropped). Empty when neither is set.
[[nodiscard]] Result<std::string> job_secret();

// PODIUM_TLS_CERT, PODIUM_TLS_KEY and PODIUM_TLS_CA, all three or none (off).
[[nodiscard]] Result<channel::TlsConfig> job_tls();

// True when PODIUM_INSECURE is "1": the user turned authentication off deliberately.
bool insecure_requested();

// SE-1: when this process has no secret and insecure_requested() is false, writes a fresh
// secret to `dir`/secret and exports PODIUM_SECRET_FILE. Returns whether it generated one.
[[nodiscard]] Result<bool> ensure_controller_secret(const std::string& dir);

// Whether this process runs on a secret SE-1 generated (for error hints).
bool secret_was_generated();

// SE-3: removes `user_dir`/PID-XXXX directories whose PID no longer runs. Returns how many.
size_t sweep_stale_socket_dirs(const std::string& user_dir);

}  // namespace podium::mesh::internal
