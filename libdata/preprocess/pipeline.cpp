// The parallel pipeline: reader thread -> N worker threads -> the calling thread as the ordered writer.
//
// Blocks carry their input position; the writer takes them back strictly in that order, so the output
// does not depend on the worker count or on scheduling. A window of 2N+2 blocks bounds the memory: the
// reader waits while that many are read but not yet written.
#include <sys/stat.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "block.h"
#include "dlm/common/atomic_file.h"
#include "dlm/common/error.h"
#include "dlm/common/progress.h"
#include "dlm/common/thread_pool.h"
#include "outputs.h"

namespace dlm::data {
namespace {

using preprocess_detail::EncodedBlock;
using BlockPtr = std::unique_ptr<EncodedBlock>;

struct Channels {
  std::mutex mutex;
  std::condition_variable reader_wake, worker_wake, writer_wake;
  std::deque<BlockPtr> to_encode;
  std::map<std::uint64_t, BlockPtr> encoded;
  std::size_t in_flight = 0;
  std::uint64_t blocks_read = 0;
  bool reading_done = false;
  bool stop = false;
};

void reader_loop(Channels& ch, LineBlockReader& reader, std::size_t window, std::size_t keys) {
  for (std::uint64_t index = 0;; ++index) {
    {
      std::unique_lock lock(ch.mutex);
      ch.reader_wake.wait(lock, [&] { return ch.stop || ch.in_flight < window; });
      if (ch.stop) break;
    }
    auto block = std::make_unique<EncodedBlock>();
    block->index = index;
    block->keys.resize(keys);
    bool more = true;
    try {
      more = reader.next(block->lines);
    } catch (...) {
      block->error = std::current_exception();  // written in order, after the blocks before it
    }
    if (!more) break;
    const bool failed = static_cast<bool>(block->error);
    {
      std::lock_guard lock(ch.mutex);
      ++ch.in_flight;
      ++ch.blocks_read;
      ch.to_encode.push_back(std::move(block));
    }
    ch.worker_wake.notify_one();
    if (failed) break;
  }
  std::lock_guard lock(ch.mutex);
  ch.reading_done = true;
  ch.worker_wake.notify_all();
  ch.writer_wake.notify_all();
}

void worker_loop(Channels& ch, const Tokenizer& tokenizer, const PreprocessOptions& options) {
  JsonFieldReader fields(options.json_keys);
  preprocess_detail::EncodeSettings settings{options.append_eod, options.split_sentences, options.skip_invalid};
  for (;;) {
    BlockPtr block;
    {
      std::unique_lock lock(ch.mutex);
      ch.worker_wake.wait(lock, [&] { return ch.stop || !ch.to_encode.empty() || ch.reading_done; });
      if (ch.stop || ch.to_encode.empty()) return;
      block = std::move(ch.to_encode.front());
      ch.to_encode.pop_front();
    }
    if (!block->error) {
      try {
        preprocess_detail::encode_block(*block, fields, tokenizer, settings);
      } catch (...) {
        block->error = std::current_exception();
      }
    }
    block->lines.bytes = {};  // the text is no longer needed; free it before the writer's turn
    std::lock_guard lock(ch.mutex);
    std::uint64_t index = block->index;
    ch.encoded.emplace(index, std::move(block));
    ch.writer_wake.notify_one();
  }
}

std::uint64_t total_input_size(const std::vector<std::string>& files) {
  std::uint64_t total = 0;
  for (const auto& f : files) {
    struct stat st{};
    if (f == "-" || ::stat(f.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return 0;
    total += static_cast<std::uint64_t>(st.st_size);
  }
  return total;
}

// Joins the threads on every way out of the writer, telling them to stop first.
struct ThreadsGuard {
  Channels& ch;
  std::vector<std::thread> threads;
  void stop() {
    {
      std::lock_guard lock(ch.mutex);
      ch.stop = true;
    }
    ch.reader_wake.notify_all();
    ch.worker_wake.notify_all();
  }
  ~ThreadsGuard() {
    stop();
    for (auto& t : threads) t.join();
  }
};

}  // namespace

PreprocessSummary preprocess_jsonl(const PreprocessOptions& options, const Tokenizer& tokenizer) {
  const auto start = std::chrono::steady_clock::now();
  if (options.json_keys.empty()) fail("--json-keys: expected at least one key");
  if (options.output_prefix.empty()) fail("--output-prefix: expected a path prefix");
  if (options.workers == 0 || options.workers > kMaxThreads)
    fail(fmt::format("--workers {}: expected 1 to {}", options.workers, kMaxThreads));
  if (options.partitions == 0 || options.partitions > kMaxPartitions)
    fail(fmt::format("--partitions {}: expected 1 to {}", options.partitions, kMaxPartitions));
  if (options.append_eod && !tokenizer.special_ids().eod) {
    fail(fmt::format("--append-eod: the {} tokenizer has no eod token", tokenizer.kind()));
  }
  // Temporaries a killed run left beside the outputs go before this run writes its own.
  const auto output_folder = std::filesystem::path(options.output_prefix).parent_path();
  remove_stale_temporaries(output_folder.empty() ? std::string(".") : output_folder.string());
  std::vector<std::string> files = expand_inputs(options.inputs);
  const double total_mb = static_cast<double>(total_input_size(files)) / 1e6;
  LineBlockReader reader(files, options.block_bytes);
  preprocess_detail::OutputSet outputs(options, optimal_token_dtype(tokenizer.vocab_size()));

  PreprocessSummary summary;
  Channels ch;
  const std::size_t window = 2 * options.workers + 2;
  {
    ThreadsGuard guard{ch, {}};
    start_threads(guard.threads, 1 + options.workers, [&](std::size_t i) {
      return i == 0 ? std::thread(reader_loop, std::ref(ch), std::ref(reader), window, options.json_keys.size())
                    : std::thread(worker_loop, std::ref(ch), std::cref(tokenizer), std::cref(options));
    }, [&guard] { guard.stop(); });
    Progress progress("dlm-preprocess", "MB", total_mb, 0.0);
    auto last_print = start;
    std::uint64_t lines_before = 0, next_log = options.log_interval;
    for (std::uint64_t next = 0;; ++next) {
      BlockPtr block;
      {
        std::unique_lock lock(ch.mutex);
        ch.writer_wake.wait(lock, [&] { return ch.encoded.count(next) != 0 || (ch.reading_done && next == ch.blocks_read); });
        auto it = ch.encoded.find(next);
        if (it == ch.encoded.end()) break;
        block = std::move(it->second);
        ch.encoded.erase(it);
      }
      if (block->error) std::rethrow_exception(block->error);
      outputs.write(*block, lines_before);
      {
        std::lock_guard lock(ch.mutex);
        --ch.in_flight;
      }
      ch.reader_wake.notify_one();
      lines_before += block->line_count;
      summary.documents += block->document_lines.size();
      summary.skipped_lines += block->skipped;
      for (auto& example : block->skipped_examples) {
        if (summary.first_skipped.size() < 5) summary.first_skipped.push_back(std::move(example));
      }
      summary.bytes_in += block->lines.used;
      auto now = std::chrono::steady_clock::now();
      if (options.progress && summary.documents >= next_log && now - last_print >= std::chrono::seconds(1)) {
        last_print = now;
        next_log = (summary.documents / options.log_interval + 1) * options.log_interval;
        double seconds = std::chrono::duration<double>(now - start).count();
        progress.update(total_mb > 0 ? static_cast<double>(block->lines.raw_position) / 1e6 : summary.bytes_in / 1e6,
                        fmt::format("{} docs ({:.0f} docs/s)", summary.documents, summary.documents / seconds));
      }
    }
  }
  outputs.finish(summary.outputs, summary.bytes_out);
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return summary;
}

std::string format_summary(const PreprocessSummary& s) {
  std::string text = fmt::format(
      "dlm-preprocess: {} documents, {:.1f} MB in, {:.1f} MB out, {:.1f}s ({:.2f} MB/s, {:.0f} docs/s)\n", s.documents,
      s.bytes_in / 1e6, s.bytes_out / 1e6, s.seconds, s.bytes_in / 1e6 / std::max(s.seconds, 1e-9),
      s.documents / std::max(s.seconds, 1e-9));
  for (const auto& out : s.outputs) {
    text += fmt::format("  {}: {} documents, {} sequences, {} tokens -> {}.bin/.idx\n", out.key, out.documents,
                        out.sequences, out.tokens, out.prefix);
  }
  if (s.skipped_lines != 0) {
    text += fmt::format("  skipped {} invalid lines (--skip-invalid), the first:\n", s.skipped_lines);
    for (const auto& line : s.first_skipped) text += "    " + line + "\n";
  }
  return text;
}

}  // namespace dlm::data
