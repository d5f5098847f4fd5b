#include "runtime/disk_cache.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <vector>

namespace tpu::runtime {
namespace fs = std::filesystem;
namespace {

constexpr char kMagic[8] = {'T', 'P', 'U', 'X', 'C', 'C', '1', '\n'};

uint64_t fnv1a(const std::string& s, uint64_t seed) {
  uint64_t h = 14695981039346656037ULL ^ seed;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}

std::string hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

void put_u64(std::string& out, uint64_t v) { out.append(reinterpret_cast<const char*>(&v), 8); }

bool get_u64(const std::string& in, size_t& pos, uint64_t* v) {
  if (pos + 8 > in.size()) return false;
  std::memcpy(v, in.data() + pos, 8);
  pos += 8;
  return true;
}

}  // namespace

DiskCache* DiskCache::get() {
  static DiskCache* cache = []() -> DiskCache* {
    const char* off = std::getenv("TPU_COMPILE_CACHE");
    if (off && std::string(off) == "0") return nullptr;
    std::string dir;
    if (const char* d = std::getenv("TPU_COMPILE_CACHE_DIR"); d && *d) {
      dir = d;
    } else if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) {
      dir = std::string(x) + "/torch_tpu/compile";
    } else if (const char* h = std::getenv("HOME"); h && *h) {
      dir = std::string(h) + "/.cache/torch_tpu/compile";
    } else {
      return nullptr;
    }
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) return nullptr;
    double mb = 2048;
    if (const char* m = std::getenv("TPU_COMPILE_CACHE_MAX_MB"); m && std::atof(m) > 0) mb = std::atof(m);
    return new DiskCache(dir, static_cast<int64_t>(mb * (1 << 20)));
  }();
  return cache;
}

std::string DiskCache::path_for(const std::string& key) const {
  return dir_ + "/" + hex(fnv1a(key, 0)) + hex(fnv1a(key, 0x9E3779B97F4A7C15ULL)) + ".exe";
}

bool DiskCache::contains(const std::string& key) const {
  std::error_code ec;
  return fs::exists(path_for(key), ec);
}

std::optional<std::string> DiskCache::load(const std::string& key) {
  std::string path = path_for(key);
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    stats_.misses += 1;
    return std::nullopt;
  }
  std::string data((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  size_t pos = sizeof(kMagic);
  uint64_t klen = 0, plen = 0, sum = 0;
  bool ok = data.size() >= pos && std::memcmp(data.data(), kMagic, pos) == 0 &&
            get_u64(data, pos, &klen) && pos + klen <= data.size() &&
            data.compare(pos, klen, key) == 0 && klen == key.size();
  if (ok) {
    pos += klen;
    ok = get_u64(data, pos, &plen) && pos + plen + 8 == data.size();
  }
  std::string payload;
  if (ok) {
    payload = data.substr(pos, plen);
    pos += plen;
    ok = get_u64(data, pos, &sum) && sum == fnv1a(payload, 1);
  }
  if (!ok) {
    // Corrupt, truncated, or another key with the same name: not ours to use.
    stats_.corrupt += 1;
    stats_.misses += 1;
    std::error_code ec;
    fs::remove(path, ec);
    return std::nullopt;
  }
  std::error_code ec;
  fs::last_write_time(path, fs::file_time_type::clock::now(), ec);  // recently used
  stats_.hits += 1;
  return payload;
}

void DiskCache::store(const std::string& key, const std::string& payload) {
  std::string data(kMagic, sizeof(kMagic));
  put_u64(data, key.size());
  data += key;
  put_u64(data, payload.size());
  data += payload;
  put_u64(data, fnv1a(payload, 1));
  std::string path = path_for(key);
  thread_local std::mt19937_64 rng{std::random_device{}()};  // stores may run on several compile threads
  std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + hex(rng());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return;  // a read-only or vanished directory: run without persisting
    f.write(data.data(), static_cast<std::streamsize>(data.size()));
    if (!f) {
      std::error_code ec;
      fs::remove(tmp, ec);
      return;
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);  // atomic: concurrent writers of one key both succeed
  if (ec) {
    fs::remove(tmp, ec);
    return;
  }
  stats_.writes += 1;
  account_write(static_cast<int64_t>(data.size()));
}

void DiskCache::account_write(int64_t bytes) {
  constexpr int64_t kRescanEvery = 1024;
  std::lock_guard<std::mutex> lock(size_mu_);
  if (known_bytes_ >= 0 && known_bytes_ + bytes <= max_bytes_ && ++writes_since_scan_ < kRescanEvery) {
    known_bytes_ += bytes;
    return;
  }
  known_bytes_ = evict_if_needed();
  writes_since_scan_ = 0;
}

void DiskCache::remove(const std::string& key) {
  std::error_code ec;
  fs::remove(path_for(key), ec);
}

// Least recently used entries go first once the directory exceeds its bound.
int64_t DiskCache::evict_if_needed() {
  stats_.scans += 1;
  struct Entry {
    fs::path path;
    fs::file_time_type time;
    uintmax_t size;
  };
  std::vector<Entry> entries;
  uintmax_t total = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    if (e.path().extension() != ".exe") continue;
    std::error_code e1, e2;
    uintmax_t size = e.file_size(e1);
    auto time = e.last_write_time(e2);
    if (e1 || e2) continue;  // removed meanwhile by another process
    entries.push_back({e.path(), time, size});
    total += size;
  }
  if (total <= static_cast<uintmax_t>(max_bytes_)) return static_cast<int64_t>(total);
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.time < b.time; });
  for (const Entry& e : entries) {
    if (total <= static_cast<uintmax_t>(max_bytes_) * 9 / 10) break;
    std::error_code rm;
    if (fs::remove(e.path, rm)) {
      total -= e.size;
      stats_.evicted += 1;
    }
  }
  return static_cast<int64_t>(total);
}

}  // namespace tpu::runtime
