// Seeded GGUF mutation run (issue 19, untrusted files): a valid small model file is cut at
// many offsets, has bytes of its header, metadata and tensor table flipped, and gets huge
// or overlapping tensor offsets, dimensions and counts and huge string lengths. Every load
// must return OK or a clean error status (no crash, no hang, no sanitizer report), and a
// model that loads must survive a context and one decode. MOEINFER_MUTATION_SEED picks
// another seed; the seed and the mutation are printed with any failure.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "gguf/gguf_reader.h"
#include "reliability/reliability_support.h"
#include "support/temp_files.h"

namespace {

std::vector<uint8_t> read_file(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

void write_file(const std::string &path, const uint8_t *p, size_t n) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char *>(p), static_cast<std::streamsize>(n));
  REQUIRE(f.good());
}

void put_u64(std::vector<uint8_t> &b, size_t at, uint64_t v) {
  if (at + 8 <= b.size()) std::memcpy(b.data() + at, &v, 8);
}
void put_u32(std::vector<uint8_t> &b, size_t at, uint32_t v) {
  if (at + 4 <= b.size()) std::memcpy(b.data() + at, &v, 4);
}

// Where the fields of one tensor-info entry lie in the file.
struct TensorField {
  size_t name_len, n_dims, dims, type, offset;
};

// Finds each tensor's entry in the table (its length-prefixed name) and the metadata keys'
// length prefixes, from the unmutated file.
void locate(const std::vector<uint8_t> &b, const moe::GgufFile &f, std::vector<TensorField> *tensors,
            std::vector<size_t> *key_lens) {
  auto find_prefixed = [&](const std::string &s, size_t from) -> size_t {
    std::vector<uint8_t> pat(8 + s.size());
    const uint64_t n = s.size();
    std::memcpy(pat.data(), &n, 8);
    std::memcpy(pat.data() + 8, s.data(), s.size());
    const size_t end = f.data_offset();
    for (size_t i = from; i + pat.size() <= end; ++i)
      if (std::memcmp(b.data() + i, pat.data(), pat.size()) == 0) return i;
    return SIZE_MAX;
  };
  size_t from = 24;
  for (const char *key : {"general.architecture", "general.name", "tokenizer.ggml.tokens", "tokenizer.ggml.model"}) {
    const size_t at = find_prefixed(key, 24);
    if (at != SIZE_MAX) key_lens->push_back(at);
  }
  for (const moe::GgufTensorInfo &t : f.tensors()) {
    const size_t at = find_prefixed(t.name, from);
    REQUIRE(at != SIZE_MAX);
    TensorField tf;
    tf.name_len = at;
    tf.n_dims = at + 8 + t.name.size();
    tf.dims = tf.n_dims + 4;
    tf.type = tf.dims + 8 * t.n_dims;
    tf.offset = tf.type + 4;
    tensors->push_back(tf);
    from = tf.offset + 8;
  }
}

const uint64_t kHuge[] = {UINT64_MAX, UINT64_MAX / 2, uint64_t(1) << 62, uint64_t(1) << 40, uint64_t(1) << 32,
                          0xFFFFFFFFu, 0x7FFFFFFFu};

// Applies mutation k (0 <= k < kinds) drawn with rng; returns the bytes and a description.
std::vector<uint8_t> mutate(const std::vector<uint8_t> &orig, size_t data_off, const std::vector<TensorField> &tf,
                            const std::vector<size_t> &key_lens, std::mt19937_64 &rng, std::string *what) {
  std::vector<uint8_t> b = orig;
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % (n ? n : 1)); };
  const uint64_t huge = kHuge[pick(sizeof kHuge / sizeof kHuge[0])];
  char buf[160];
  switch (pick(8)) {
    case 0: {  // truncate, mostly inside the header region
      const size_t at = pick(4) ? pick(data_off + 64) : pick(b.size());
      b.resize(std::min(at, b.size()));
      std::snprintf(buf, sizeof buf, "truncate to %zu bytes", at);
      break;
    }
    case 1: {  // flip bytes in the header / metadata / tensor table
      const int n = 1 + static_cast<int>(pick(8));
      std::snprintf(buf, sizeof buf, "flip %d bytes before %zu, first at", n, data_off);
      std::string s = buf;
      for (int i = 0; i < n; ++i) {
        const size_t at = pick(data_off);
        if (i == 0) s += " " + std::to_string(at);
        b[at] ^= static_cast<uint8_t>(1 + pick(255));
      }
      *what = s;
      return b;
    }
    case 2: put_u64(b, 8, huge); std::snprintf(buf, sizeof buf, "tensor count = %llu", static_cast<unsigned long long>(huge)); break;
    case 3: put_u64(b, 16, huge); std::snprintf(buf, sizeof buf, "metadata count = %llu", static_cast<unsigned long long>(huge)); break;
    case 4: {  // tensor offset: huge, or another tensor's (overlap), or unaligned
      const size_t t = pick(tf.size()), u = pick(tf.size());
      uint64_t v = huge;
      const int how = static_cast<int>(pick(3));
      if (how == 1) std::memcpy(&v, orig.data() + tf[u].offset, 8);
      if (how == 2) { std::memcpy(&v, orig.data() + tf[t].offset, 8); v += 1 + pick(31); }
      put_u64(b, tf[t].offset, v);
      std::snprintf(buf, sizeof buf, "tensor %zu offset = %llu (%s)", t, static_cast<unsigned long long>(v),
                    how == 0 ? "huge" : how == 1 ? "overlap" : "unaligned");
      break;
    }
    case 5: {  // tensor dimensions / dimension count / type
      const size_t t = pick(tf.size());
      const int field = static_cast<int>(pick(3));
      if (field == 0) put_u64(b, tf[t].dims + 8 * pick(2), huge);
      if (field == 1) put_u32(b, tf[t].n_dims, static_cast<uint32_t>(huge));
      if (field == 2) put_u32(b, tf[t].type, static_cast<uint32_t>(pick(64)));
      std::snprintf(buf, sizeof buf, "tensor %zu %s = %llu", t, field == 0 ? "dim" : field == 1 ? "n_dims" : "type",
                    static_cast<unsigned long long>(huge));
      break;
    }
    case 6: {  // string lengths: a key's or a tensor name's
      const bool key = !key_lens.empty() && pick(2);
      const size_t at = key ? key_lens[pick(key_lens.size())] : tf[pick(tf.size())].name_len;
      put_u64(b, at, huge);
      std::snprintf(buf, sizeof buf, "string length at %zu = %llu", at, static_cast<unsigned long long>(huge));
      break;
    }
    default: {  // a run of 0xFF or 0x00 over a random stretch of the table
      const size_t at = pick(data_off), n = 1 + pick(64);
      const uint8_t v = pick(2) ? 0xFF : 0x00;
      for (size_t i = at; i < at + n && i < b.size(); ++i) b[i] = v;
      std::snprintf(buf, sizeof buf, "%zu bytes of 0x%02X at %zu", n, v, at);
      break;
    }
  }
  *what = buf;
  return b;
}

bool clean_load_error(moe_status s) {
  return s == MOE_STATUS_INVALID_GGUF || s == MOE_STATUS_INVALID_MODEL || s == MOE_STATUS_INVALID_VOCAB ||
         s == MOE_STATUS_UNSUPPORTED || s == MOE_STATUS_IO_ERROR || s == MOE_STATUS_OUT_OF_MEMORY;
}

}  // namespace

TEST_CASE("reliability: seeded GGUF mutations load cleanly or fail with a status", "[reliability][gguf][mutation]") {
  const char *env = std::getenv("MOEINFER_MUTATION_SEED");
  const uint64_t seed = env ? std::strtoull(env, nullptr, 10) : 20261202;
  const int n_mutations = moe_rel::kSanitized ? 800 : 2000;
  const std::string src = moe_test::tiny_model("q8_0");
  const std::vector<uint8_t> orig = read_file(src);
  auto gf = moe::GgufFile::open(src);
  const size_t data_off = gf->data_offset();
  std::vector<TensorField> tf;
  std::vector<size_t> key_lens;
  locate(orig, *gf, &tf, &key_lens);
  REQUIRE(tf.size() == gf->tensors().size());
  gf.reset();
  const std::string path = moe_test::temp_path("mutated.gguf");
  std::mt19937_64 rng(seed);
  int loaded = 0, decoded = 0;
  std::map<std::string, int> statuses;  // load results, printed
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n_mutations; ++i) {
    std::string what;
    const std::vector<uint8_t> b = mutate(orig, data_off, tf, key_lens, rng, &what);
    INFO("seed " << seed << ", mutation " << i << ": " << what << " (MOEINFER_MUTATION_SEED=" << seed << ")");
    write_file(path, b.data(), b.size());
    moe_model_params mp = moe_model_default_params_v2();
    mp.use_mmap = static_cast<int32_t>(i % 2);
    moe_model *m = nullptr;
    const moe_status st = moe_model_load(path.c_str(), &mp, &m);
    ++statuses[moe_status_string(st)];
    if (st != MOE_STATUS_OK) {
      CHECK(clean_load_error(st));
      CHECK(std::strlen(moe_last_error()) > 0);
      CHECK(m == nullptr);
      continue;
    }
    ++loaded;
    moe_context_params cp = moe_context_default_params_v2();
    cp.n_ctx = 16;
    cp.n_threads = 1;
    cp.device = "cpu";
    moe_context *c = nullptr;
    const moe_status cs = moe_context_create(m, &cp, &c);
    if (cs == MOE_STATUS_OK) {
      moe_batch *batch = nullptr;
      REQUIRE(moe_batch_create(4, &batch) == MOE_STATUS_OK);
      for (int p = 0; p < 4; ++p) moe_batch_add(batch, 3 + p, p, 0, p == 3);
      const moe_status ds = moe_decode(c, batch);
      CHECK((ds == MOE_STATUS_OK || ds == MOE_STATUS_NUMERIC_ERROR || ds == MOE_STATUS_INVALID_ARGUMENT));
      decoded += ds == MOE_STATUS_OK;
      moe_batch_free(batch);
      moe_context_free(c);
    } else {
      CHECK(std::strlen(moe_last_error()) > 0);
    }
    moe_model_free(m);
  }
  std::remove(path.c_str());
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("GGUF mutations: %d (seed %llu), %d loaded, %d decoded, %.1f s\n", n_mutations,
              static_cast<unsigned long long>(seed), loaded, decoded, s);
  for (const auto &kv : statuses) std::printf("  %s: %d\n", kv.first.c_str(), kv.second);
  CHECK(loaded < n_mutations);  // the mutations do reach the checks
  CHECK(s < 60.0);
}
