#include "transport/auth.h"

#include <fmt/format.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "troupe/error.h"

namespace troupe::transport {
namespace {

constexpr char kMagic[4] = {'T', 'R', 'P', 'H'};
constexpr std::uint8_t kVersion = 1;
constexpr char kLabel[] = "troupe-auth-1";

void randomBytes(std::span<std::byte> out) {
  if (RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(out.size())) != 1) {
    throw IoError("authentication: the system gave no random bytes (OpenSSL RAND_bytes failed)");
  }
}

}  // namespace

Handshake::Handshake(std::string secret, std::string scope, bool dialer)
    : secret_(std::move(secret)), scope_(std::move(scope)), role_(dialer ? 0 : 1) {
  std::memcpy(challenge_.data(), kMagic, 4);
  challenge_[4] = std::byte{kVersion};
  challenge_[5] = std::byte{role_};
  randomBytes(std::span(challenge_).subspan<8, 32>());
}

void Handshake::peerChallenge(std::span<const std::byte, kChallengeBytes> bytes) {
  if (std::memcmp(bytes.data(), kMagic, 4) != 0) {
    throw InputError("not a troupe peer (no handshake; wrong protocol or port)");
  }
  if (bytes[4] != std::byte{kVersion}) {
    throw InputError(fmt::format("handshake version {}, this troupe speaks {}",
                                 static_cast<int>(bytes[4]), kVersion));
  }
  if (bytes[5] != std::byte{static_cast<std::uint8_t>(1 - role_)}) {
    throw InputError("the peer's handshake has the wrong role (a reflected challenge?)");
  }
  std::memcpy(peerNonce_.data(), bytes.data() + 8, 32);
  havePeer_ = true;
}

std::array<std::byte, kProofBytes> Handshake::mac(std::uint8_t role,
                                                  std::span<const std::byte, 32> first,
                                                  std::span<const std::byte, 32> second) const {
  std::string text(kLabel, sizeof kLabel);
  text.push_back(static_cast<char>(role));
  const auto scopeBytes = static_cast<std::uint32_t>(scope_.size());
  text.append(reinterpret_cast<const char*>(&scopeBytes), 4);
  text += scope_;
  text.append(reinterpret_cast<const char*>(first.data()), 32);
  text.append(reinterpret_cast<const char*>(second.data()), 32);
  std::array<std::byte, kProofBytes> out{};
  unsigned int length = 0;
  static const unsigned char kEmpty = 0;
  const void* key = secret_.empty() ? static_cast<const void*>(&kEmpty) : secret_.data();
  if (!HMAC(EVP_sha256(), key, static_cast<int>(secret_.size()),
            reinterpret_cast<const unsigned char*>(text.data()), text.size(),
            reinterpret_cast<unsigned char*>(out.data()), &length) ||
      length != kProofBytes) {
    throw IoError("authentication: HMAC-SHA256 failed (OpenSSL)");
  }
  return out;
}

std::array<std::byte, kProofBytes> Handshake::proof() const {
  if (!havePeer_) throw InvariantError("handshake proof before the peer's challenge");
  return mac(role_, std::span(challenge_).subspan<8, 32>(), peerNonce_);
}

bool Handshake::verify(std::span<const std::byte, kProofBytes> peerProof) const {
  if (!havePeer_) return false;
  const auto expected =
      mac(static_cast<std::uint8_t>(1 - role_), peerNonce_, std::span(challenge_).subspan<8, 32>());
  return CRYPTO_memcmp(expected.data(), peerProof.data(), kProofBytes) == 0;
}

std::string loadSecret(const std::string& secretFile) {
  if (secretFile.empty()) {
    if (const char* file = std::getenv("TROUPE_SECRET_FILE"); file && *file) {
      return loadSecret(file);
    }
    const char* env = std::getenv("TROUPE_SECRET");
    return env ? env : "";
  }
  std::ifstream in(secretFile, std::ios::binary);
  if (!in) throw InputError(fmt::format("cannot read the secret file {}", secretFile));
  // Read at most one byte past the limit, whatever the file claims its size is (/dev/zero, /proc).
  constexpr std::size_t kMaxSecretBytes = 64 << 10;
  std::string secret(kMaxSecretBytes + 1, '\0');
  in.read(secret.data(), static_cast<std::streamsize>(secret.size()));
  secret.resize(static_cast<std::size_t>(in.gcount()));
  if (secret.size() > kMaxSecretBytes) {
    throw InputError(fmt::format("the secret file {} holds over {} KiB; a secret is one line",
                                 secretFile, kMaxSecretBytes >> 10));
  }
  while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r'))
    secret.pop_back();
  if (secret.empty()) throw InputError(fmt::format("the secret file {} is empty", secretFile));
  return secret;
}

std::string makeSecret() {
  std::array<std::byte, 32> bytes{};
  randomBytes(bytes);
  std::string hex;
  for (auto b : bytes)
    hex += fmt::format("{:02x}", static_cast<unsigned>(b));
  return hex;
}

}  // namespace troupe::transport
