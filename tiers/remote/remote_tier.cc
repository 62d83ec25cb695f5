// RemoteTier implementation: value encoding, verification, batched GET/SET/EXISTS.
#include "tiers/remote/remote_tier.h"

#include <hiredis/hiredis.h>
#include <spdlog/spdlog.h>
#include <xxhash.h>
#include <zstd.h>

#include <chrono>
#include <cstring>

#include "formats/contract.h"
#include "formats/bytes.h"
#include "formats/record.h"
#include "tiers/remote/connection.h"

namespace kvtier::remote {

namespace {

void WriteEnvelope(uint8_t* p, uint16_t codec, uint64_t body_len, uint64_t record_len) {
  PutAt<uint32_t>(p, 0, kRemoteMagic);
  PutAt<uint16_t>(p, 4, kRemoteFormatVersion);
  PutAt<uint16_t>(p, 6, codec);
  PutAt<uint64_t>(p, 8, body_len);
  PutAt<uint64_t>(p, 16, record_len);
  PutAt<uint64_t>(p, 24, XXH3_64bits(p, 24));
}

}  // namespace

std::string RedisKey(std::string_view prefix, std::string_view ns, uint64_t contract_id, const Key128& key) {
  std::string k;
  k.reserve(prefix.size() + ns.size() + 53);
  k.append(prefix);
  if (!ns.empty()) {
    k.append(ns);
    k += ':';
  }
  k += '{';
  k += ContractIdHex(contract_id);
  k += ':';
  k += key.ToHex();
  k += '}';
  return k;
}

std::string RedisKey(uint64_t contract_id, const Key128& key) { return RedisKey(kDefaultKeyPrefix, "", contract_id, key); }

Status CheckKeyPart(std::string_view part, const char* what) {
  if (part.size() > kMaxKeyPartBytes) {
    return Status::Invalid(std::string(what) + " is longer than " + std::to_string(kMaxKeyPartBytes) + " bytes");
  }
  for (unsigned char ch : part) {
    if (ch <= 0x20 || ch >= 0x7f || ch == '{' || ch == '}') {
      return Status::Invalid(std::string(what) + " \"" + std::string(part) +
                             "\" holds a character other than printable ASCII without space and braces");
    }
  }
  return Status::Ok();
}

std::string EncodeValue(const PutItem& item, bool compress) {
  RecordHeader h;
  h.contract_id = item.contract_id;
  h.key = item.key;
  h.parent = item.parent;
  h.payload_len = item.payload.size();
  h.payload_xxh3 = PayloadChecksum(item.payload);
  h.sequence = 0;
  const size_t record_len = kRecordHeaderSize + item.payload.size();
  std::string v(kEnvelopeSize + record_len, '\0');
  auto* p = reinterpret_cast<uint8_t*>(v.data());
  h.Encode(p + kEnvelopeSize);
  std::memcpy(p + kEnvelopeSize + kRecordHeaderSize, item.payload.data(), item.payload.size());
  if (compress) {
    std::string z(kEnvelopeSize + ZSTD_compressBound(record_len), '\0');
    const size_t n = ZSTD_compress(z.data() + kEnvelopeSize, z.size() - kEnvelopeSize, v.data() + kEnvelopeSize,
                                   record_len, 1);
    if (!ZSTD_isError(n) && n <= record_len - record_len / 8) {  // pays: saves >= 1/8
      z.resize(kEnvelopeSize + n);
      WriteEnvelope(reinterpret_cast<uint8_t*>(z.data()), 1, n, record_len);
      return z;
    }
  }
  WriteEnvelope(p, 0, record_len, record_len);
  return v;
}

namespace {

// Checks the envelope of a value of `value_len` bytes whose first bytes are `p`.
Status CheckEnvelope(const uint8_t* p, uint64_t value_len, size_t out_size, uint16_t* codec) {
  if (value_len < kEnvelopeSize) return Status::Corrupt("remote value shorter than its envelope");
  if (GetAt<uint32_t>(p, 0) != kRemoteMagic) return Status::Corrupt("remote value: bad magic");
  if (GetAt<uint64_t>(p, 24) != XXH3_64bits(p, 24)) return Status::Corrupt("remote value: envelope checksum mismatch");
  if (GetAt<uint16_t>(p, 4) != kRemoteFormatVersion) return Status::Corrupt("remote value: unknown version");
  *codec = GetAt<uint16_t>(p, 6);
  const uint64_t body_len = GetAt<uint64_t>(p, 8), record_len = GetAt<uint64_t>(p, 16);
  if (body_len != value_len - kEnvelopeSize) return Status::Corrupt("remote value: body length mismatch");
  if (record_len != kRecordHeaderSize + out_size) return Status::Corrupt("remote value: record length is not the block size");
  if (*codec != 1 && (*codec != 0 || body_len != record_len)) return Status::Corrupt("remote value: bad codec or length");
  return Status::Ok();
}

// Checks a record header against the identity asked for.
StatusOr<RecordHeader> CheckHeader(const uint8_t* rec, uint64_t contract_id, const Key128& key) {
  auto h = RecordHeader::Decode(std::span<const uint8_t>(rec, kRecordHeaderSize));
  if (!h.ok()) return Status::Corrupt("remote value: " + h.status().message());
  if (h->contract_id != contract_id) return Status::Corrupt("remote value: another contract's record");
  if (h->key != key) return Status::Corrupt("remote value: another key's record");
  return h;
}

}  // namespace

Status DecodeSunkValue(std::string_view head, uint64_t contract_id, const Key128& key, std::span<const uint8_t> out,
                       Key128* parent) {
  if (head.size() != kEnvelopeSize + kRecordHeaderSize) return Status::Corrupt("remote value: bad head");
  const auto* p = reinterpret_cast<const uint8_t*>(head.data());
  uint16_t codec = 0;
  KVTIER_RETURN_IF_ERROR(CheckEnvelope(p, head.size() + out.size(), out.size(), &codec));
  if (codec != 0) return Status::Corrupt("remote value: compressed body of the stored size");
  auto h = CheckHeader(p + kEnvelopeSize, contract_id, key);
  if (!h.ok()) return h.status();
  Status s = VerifyPayload(*h, out);
  if (!s.ok()) return Status::Corrupt("remote value: " + s.message());
  if (parent) *parent = h->parent;
  return Status::Ok();
}

Status DecodeValue(std::string_view value, uint64_t contract_id, const Key128& key, std::span<uint8_t> out,
                   Key128* parent) {
  const auto* p = reinterpret_cast<const uint8_t*>(value.data());
  uint16_t codec = 0;
  KVTIER_RETURN_IF_ERROR(CheckEnvelope(p, value.size(), out.size(), &codec));
  const uint64_t record_len = kRecordHeaderSize + out.size();
  std::string_view body = value.substr(kEnvelopeSize);
  std::string inflated;
  if (codec == 1) {
    inflated.resize(record_len);
    const size_t n = ZSTD_decompress(inflated.data(), inflated.size(), body.data(), body.size());
    if (ZSTD_isError(n) || n != record_len) return Status::Corrupt("remote value: zstd body does not decode");
    body = inflated;
  }
  const auto* rec = reinterpret_cast<const uint8_t*>(body.data());
  auto h = CheckHeader(rec, contract_id, key);
  if (!h.ok()) return h.status();
  std::span<const uint8_t> payload(rec + kRecordHeaderSize, out.size());
  Status s = VerifyPayload(*h, payload);
  if (!s.ok()) return Status::Corrupt("remote value: " + s.message());
  std::memcpy(out.data(), payload.data(), payload.size());
  if (parent) *parent = h->parent;
  return Status::Ok();
}

StatusOr<std::unique_ptr<RemoteTier>> RemoteTier::Open(const RemoteOptions& opts) {
  KVTIER_RETURN_IF_ERROR(CheckKeyPart(opts.key_prefix, "remote tier: key_prefix"));
  if (!opts.user.empty() && opts.password_file.empty()) {
    return Status::Invalid("remote tier: user \"" + opts.user + "\" needs a password_file");
  }
  ClusterOptions co;
  co.nodes = opts.nodes;
  co.connect_timeout_ms = opts.connect_timeout_ms;
  co.command_timeout_ms = opts.command_timeout_ms;
  co.pool_size = opts.pool_size;
  co.user = opts.user;
  co.tls = opts.tls;
  if (!opts.password_file.empty()) {
    auto pw = ReadPasswordFile(opts.password_file);
    if (!pw.ok()) return Status::Invalid("remote tier: " + pw.status().message());
    co.password = std::move(pw.value());
  }
  auto c = ClusterClient::Open(co);
  if (!c.ok()) return c.status();
  auto t = std::unique_ptr<RemoteTier>(new RemoteTier());
  t->opts_ = opts;
  t->client_ = std::move(c.value());
  return t;
}

void RemoteTier::GetBatch(std::span<GetItem> items) {
  std::vector<std::string> keys(items.size());
  std::vector<Command> cmds;
  std::vector<size_t> run;  // the items with a valid namespace, in order
  run.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    if (Status s = CheckKeyPart(items[i].ns, "remote tier: namespace"); !s.ok()) {
      items[i].status = s;
      errors_++;
      continue;
    }
    run.push_back(i);
  }
  cmds.resize(run.size());
  for (size_t j = 0; j < run.size(); ++j) {
    const size_t i = run[j];
    keys[i] = KeyOf(items[i].ns, items[i].contract_id, items[i].key);
    cmds[j].argv = {"GET", keys[i]};
    cmds[j].sink = items[i].out;  // a stored (uncompressed) value lands in out directly
    cmds[j].sink_prefix = kEnvelopeSize + kRecordHeaderSize;
  }
  const auto t0 = std::chrono::steady_clock::now();
  client_->Exec(cmds);
  uint64_t got = 0;
  for (size_t j = 0; j < run.size(); ++j) {
    const size_t i = run[j];
    GetItem& it = items[i];
    const Command& c = cmds[j];
    if (!c.status.ok()) {
      it.status = c.status;
      errors_++;
      continue;
    }
    if (c.reply->type == REDIS_REPLY_NIL) {
      it.status = Status::NotFound("remote: no value");
      misses_++;
      continue;
    }
    if (c.reply->type != REDIS_REPLY_STRING) {
      it.status = Status::Corrupt("remote: value is not a string");
      corrupt_++;
      continue;
    }
    const std::string_view v(c.reply->str, c.reply->len);
    got += c.reply->len + (c.sunk ? it.out.size() : 0);
    it.status = c.sunk ? DecodeSunkValue(v, it.contract_id, it.key, it.out, &it.parent)
                       : DecodeValue(v, it.contract_id, it.key, it.out, &it.parent);
    if (it.status.ok()) {
      hits_++;
      bytes_read_ += it.out.size();
    } else {
      corrupt_++;
      spdlog::warn("remote tier: {} under {} (served as a miss)", it.status.message(), keys[i]);
    }
  }
  if (got > 0) {
    read_ns_ += static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
    read_bytes_timed_ += got;
  }
}

size_t RemoteTier::PutBatch(std::span<const PutItem> items) {
  std::vector<std::string> keys, vals;
  std::vector<Command> cmds;
  keys.reserve(items.size());
  vals.reserve(items.size());
  cmds.reserve(items.size());
  for (const PutItem& it : items) {
    if (!CheckKeyPart(it.ns, "namespace").ok()) {
      write_errors_++;
      continue;
    }
    keys.push_back(KeyOf(it.ns, it.contract_id, it.key));
    vals.push_back(EncodeValue(it, opts_.compress));
  }
  cmds.resize(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) cmds[i].argv = {"SET", keys[i], vals[i]};
  client_->Exec(cmds);
  size_t ok = 0;
  for (size_t i = 0; i < cmds.size(); ++i) {
    if (cmds[i].status.ok() && cmds[i].reply->type == REDIS_REPLY_STATUS) {
      ++ok;
      writes_++;
      bytes_written_ += vals[i].size();
    } else {
      write_errors_++;
    }
  }
  return ok;
}

size_t RemoteTier::ExistsPrefix(uint64_t contract_id, std::span<const Key128> keys, std::string_view ns) {
  if (!CheckKeyPart(ns, "namespace").ok()) {
    errors_++;
    return 0;
  }
  std::vector<std::string> rk(keys.size());
  std::vector<Command> cmds(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    rk[i] = KeyOf(ns, contract_id, keys[i]);
    cmds[i].argv = {"EXISTS", rk[i]};
  }
  client_->Exec(cmds);
  size_t n = 0;
  while (n < keys.size() && cmds[n].status.ok() && cmds[n].reply->type == REDIS_REPLY_INTEGER &&
         cmds[n].reply->integer == 1) {
    ++n;
  }
  if (n < keys.size() && !cmds[n].status.ok()) errors_++;
  return n;
}

RemoteStats RemoteTier::stats() const {
  RemoteStats s;
  s.hits = hits_;
  s.misses = misses_;
  s.errors = errors_;
  s.corrupt = corrupt_;
  s.bytes_read = bytes_read_;
  s.bytes_written = bytes_written_;
  s.writes = writes_;
  s.write_errors = write_errors_;
  const uint64_t ns = read_ns_;
  s.read_gbps = ns ? static_cast<double>(read_bytes_timed_) / static_cast<double>(ns) : 0.0;
  return s;
}

}  // namespace kvtier::remote
