// Peer authentication: every connection of a run (transport links, the embedded store) starts
// with a challenge-response handshake keyed by the run's secret, before either side reads a byte
// of anything else.
//
//   1. Each side sends a challenge (40 bytes): magic "TRPH", version 1, its role (0 the side that
//      dialed, 1 the side that accepted), two zero bytes, and 32 random bytes (a nonce).
//   2. Each side sends its proof (32 bytes): HMAC-SHA256 keyed by the secret over
//      "troupe-auth-1", its role, the scope (the run id, or "store"), its nonce, the peer's nonce.
//   3. Each side checks the peer's proof (constant time) and closes the connection if it is wrong.
// Fresh nonces on both sides make every proof single-use; the role in the MAC keeps a side's own
// proof from being reflected back to it; the scope keeps another run sharing the secret out.
// With no secret (a run started by hand without one) the handshake still runs, keyed by the empty
// string: it then checks the protocol and the run id only, and the process warns that its links
// are not authenticated.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace troupe::transport {

inline constexpr std::size_t kChallengeBytes = 40;
inline constexpr std::size_t kProofBytes = 32;

// One side's handshake. Not thread-safe; cheap.
class Handshake {
 public:
  Handshake(std::string secret, std::string scope, bool dialer);

  const std::array<std::byte, kChallengeBytes>& challenge() const { return challenge_; }
  // Takes the peer's challenge; throws InputError if it is not one (bad magic, version, or the
  // same role as ours).
  void peerChallenge(std::span<const std::byte, kChallengeBytes> bytes);
  // Ours, once the peer's challenge is in.
  std::array<std::byte, kProofBytes> proof() const;
  // Whether the peer's proof is right, once its challenge is in.
  bool verify(std::span<const std::byte, kProofBytes> peerProof) const;

 private:
  std::array<std::byte, kProofBytes> mac(std::uint8_t role, std::span<const std::byte, 32> first,
                                         std::span<const std::byte, 32> second) const;

  std::string secret_, scope_;
  std::uint8_t role_;
  std::array<std::byte, kChallengeBytes> challenge_{};
  std::array<std::byte, 32> peerNonce_{};
  bool havePeer_ = false;
};

// The run's secret: the contents of `secretFile` (trailing newlines dropped) if given, else of the
// file $TROUPE_SECRET_FILE names, else $TROUPE_SECRET, else "". Throws InputError naming the file
// if it cannot be read or is empty.
std::string loadSecret(const std::string& secretFile);

// 32 random bytes as 64 hex digits, for a launcher's per-run secret.
std::string makeSecret();

}  // namespace troupe::transport
