// A persistent, size-bounded cache of compiled executables on disk, shared by processes.
// Entries are written to a temporary file and renamed into place (readers never see a
// partial entry); each holds its full key and a checksum, so a corrupt or colliding
// entry is detected, deleted and recompiled.
#pragma once
#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>

namespace tpu::runtime {

struct DiskCacheStats {
  std::atomic<int64_t> hits{0}, misses{0}, writes{0}, corrupt{0}, evicted{0}, scans{0};
};

class DiskCache {
 public:
  // The cache at TPU_COMPILE_CACHE_DIR (default: $XDG_CACHE_HOME or ~/.cache, then
  // torch_tpu/compile), bounded by TPU_COMPILE_CACHE_MAX_MB (default 2048);
  // null when TPU_COMPILE_CACHE=0 or no directory can be made.
  static DiskCache* get();
  DiskCache(std::string dir, int64_t max_bytes) : dir_(std::move(dir)), max_bytes_(max_bytes) {}

  std::optional<std::string> load(const std::string& key);
  // Whether an entry for `key` exists (not read or checked: a prediction of load's answer).
  bool contains(const std::string& key) const;
  void store(const std::string& key, const std::string& payload);
  // Drops the entry (after the plugin rejected its bytes).
  void remove(const std::string& key);
  const std::string& dir() const { return dir_; }
  DiskCacheStats& stats() { return stats_; }

 private:
  std::string path_for(const std::string& key) const;
  // Adds a written entry to the running size; lists the directory only when the bound may
  // be crossed or after many writes (other processes write too), not once per write: a
  // listing of tens of thousands of entries costs more than compiling a small program.
  void account_write(int64_t bytes);
  int64_t evict_if_needed();  // the directory's size after eviction

  std::mutex size_mu_;
  int64_t known_bytes_ = -1;  // -1: not listed yet by this process
  int64_t writes_since_scan_ = 0;

  std::string dir_;
  int64_t max_bytes_;
  DiskCacheStats stats_;
};

}  // namespace tpu::runtime
