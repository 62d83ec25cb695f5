// Reading and writing export files (.kvt, byte format in formats/export.h).
//
// ExportWriter writes FILE.tmp.XXXXXX (a fresh name made with O_EXCL, so never through a
// planted file or link) and renames it into place on Finish(), so a crash or an error
// never leaves a partial file under the real name. ExportReader reads frames one
// by one; VerifyAll() runs the whole file through every check (frame checksums, record
// headers, decompression, payload checksums, trailer) without handing out any data,
// which is how `kvtierctl import` refuses a corrupt file before it stores anything.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "formats/contract.h"
#include "formats/export.h"
#include "formats/status.h"

namespace kvtier {

class ExportWriter {
 public:
  static StatusOr<std::unique_ptr<ExportWriter>> Create(const std::string& path,
                                                        const ScaleContract& contract,
                                                        int zstd_level = 3);
  ~ExportWriter();
  // payload.size() must not exceed the contract's block bytes.
  Status Add(const Key128& key, const Key128& parent, std::span<const uint8_t> payload);
  Status Finish();

  uint64_t records() const { return sums_.size(); }
  uint64_t raw_bytes() const { return raw_bytes_; }        // payload bytes in
  uint64_t stored_bytes() const { return stored_bytes_; }  // payload bytes as stored
  uint64_t compressed_records() const { return compressed_; }

 private:
  ExportWriter() = default;
  Status Write(const void* p, size_t n);
  std::string path_, tmp_;
  std::FILE* f_ = nullptr;
  ScaleContract contract_;
  uint64_t contract_id_ = 0;
  int level_ = 3;
  bool finished_ = false;
  std::vector<uint64_t> sums_;
  uint64_t raw_bytes_ = 0, stored_bytes_ = 0, compressed_ = 0;
};

class ExportReader {
 public:
  static StatusOr<std::unique_ptr<ExportReader>> Open(const std::string& path);
  ~ExportReader();
  const ScaleContract& contract() const { return contract_; }
  uint64_t contract_id() const { return contract_id_; }
  uint64_t file_bytes() const { return file_bytes_; }

  // Next record; *eof is set (and the trailer checked) after the last one.
  Status Next(RecordHeader* rec, std::vector<uint8_t>* payload, bool* eof);
  // Rewinds to the first record.
  Status Rewind();
  // Reads and checks every record and the trailer. progress(bytes_done, file_bytes) is
  // called after each record. Leaves the reader rewound, also when a record fails.
  Status VerifyAll(const std::function<void(uint64_t, uint64_t)>& progress, uint64_t* records);

 private:
  ExportReader() = default;
  std::FILE* f_ = nullptr;
  ScaleContract contract_;
  uint64_t contract_id_ = 0, file_bytes_ = 0, data_start_ = 0, max_payload_ = 0;
  std::vector<uint64_t> sums_;
  bool done_ = false;
};

}  // namespace kvtier
