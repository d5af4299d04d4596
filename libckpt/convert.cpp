// dlm-ckpt convert: HF <-> native, and native resharding rank by rank.
#include <cctype>
#include <filesystem>

#include <fmt/format.h>

#include "dlm/ckpt/megatron.h"
#include "dlm/ckpt/tools.h"
#include "dlm/common/error.h"

namespace dlm::ckpt {

namespace fs = std::filesystem;

namespace {

HfExportOptions hf_export_options(const ConvertOptions& o, const std::string& tokenizer_dir) {
  return {.dtype = o.dtype, .tokenizer_dir = tokenizer_dir, .max_shard_bytes = o.max_shard_bytes, .num_shards = o.num_shards};
}

// Megatron output from the whole model of any input, with its training state where it has one.
std::string export_megatron(const std::string& input, const std::string& output, const ConvertOptions& o) {
  MegatronCheckpoint m;
  if (o.from == CheckpointKind::kMegatron) m = load_megatron(input);
  else if (o.from == CheckpointKind::kHuggingFace) {
    HfModel h = load_hf_folder(input, o.make_vocab_size_divisible_by);
    m.config = std::move(h.config), m.tensors = std::move(h.tensors);
  } else {
    CheckpointReader r(input);
    m.config = r.metadata().config, m.state = r.metadata().state, m.tensors = r.read_global(false).params;
  }
  refuse_non_finite(m.tensors, input);
  return save_megatron_torch_dist(output, m.config, m.tensors, m.state, o.megatron);
}

}  // namespace

bool parse_byte_size(std::string_view text, std::uint64_t& bytes) {
  std::size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  if (digits == 0 || digits > 15) return false;
  const std::uint64_t n = std::stoull(std::string(text.substr(0, digits)));
  std::string unit(text.substr(digits));
  for (char& ch : unit) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  if (unit.empty() || unit == "B") return bytes = n, n > 0;
  static const std::string prefixes = "KMGT";
  const std::size_t p = unit.size() >= 2 ? prefixes.find(unit[0]) : std::string::npos;
  if (p == std::string::npos || (unit.substr(1) != "B" && unit.substr(1) != "IB")) return false;
  const std::uint64_t base = unit.substr(1) == "B" ? 1000 : 1024;
  std::uint64_t scale = 1;
  for (std::size_t i = 0; i <= p; ++i) scale *= base;
  bytes = n * scale;
  return n > 0;
}

CheckpointKind detect_kind(const std::string& path) {
  if (fs::exists(fs::path(path) / "config.json")) return CheckpointKind::kHuggingFace;
  if (fs::exists(fs::path(path) / "metadata.json") || fs::exists(fs::path(path) / "latest")) return CheckpointKind::kNative;
  if (is_megatron_legacy(path) || is_megatron_torch_dist(path)) return CheckpointKind::kMegatron;
  fail_at(path, "neither a Hugging Face folder (config.json) nor a dlm checkpoint (metadata.json or latest)");
}

HfModel load_any(const std::string& path, int divisible_by) {
  const CheckpointKind kind = detect_kind(path);
  if (kind == CheckpointKind::kHuggingFace) return load_hf_folder(path, divisible_by);
  if (kind == CheckpointKind::kMegatron) {
    MegatronCheckpoint m = load_megatron(path);
    return {m.config, std::move(m.tensors)};
  }
  CheckpointReader r(path);
  return {r.metadata().config, r.read_global(false).params};
}

std::string convert_checkpoint(const std::string& input, const std::string& output, const ConvertOptions& o) {
  if (o.to == CheckpointKind::kMegatron) return export_megatron(input, output, o);
  if (o.from == CheckpointKind::kMegatron) {
    MegatronCheckpoint m = load_megatron(input);
    if (o.to == CheckpointKind::kHuggingFace) {
      export_hf_folder(output, m.config, m.tensors, {.dtype = o.dtype, .tokenizer_dir = o.tokenizer_dir});
      return output;
    }
    if (o.to != CheckpointKind::kNative) fail("convert --from megatron writes native or hf");
    const std::string dir = save_checkpoint(output, m.config, o.layout, {std::move(m.tensors), std::move(m.exp_avg), std::move(m.exp_avg_sq)}, m.state);
    if (!o.tokenizer_dir.empty()) copy_tokenizer_files(o.tokenizer_dir, (fs::path(dir) / "tokenizer").string());
    return dir;
  }
  if (o.from == CheckpointKind::kHuggingFace) {
    HfModel m = load_hf_folder(input, o.make_vocab_size_divisible_by);
    refuse_non_finite(m.tensors, input);
    if (o.to == CheckpointKind::kHuggingFace) {
      export_hf_folder(output, m.config, m.tensors, hf_export_options(o, o.tokenizer_dir.empty() ? input : o.tokenizer_dir));
      return output;
    }
    const std::string dir = save_checkpoint(output, m.config, o.layout, {std::move(m.tensors), {}, {}}, {});
    copy_tokenizer_files(o.tokenizer_dir.empty() ? input : o.tokenizer_dir, (fs::path(dir) / "tokenizer").string());
    return dir;
  }
  CheckpointReader r(input);
  const std::string tokenizer = o.tokenizer_dir.empty() ? (fs::path(r.dir()) / "tokenizer").string() : o.tokenizer_dir;
  if (o.to == CheckpointKind::kHuggingFace) {
    const TensorSet params = r.read_global(false).params;
    refuse_non_finite(params, input);
    export_hf_folder(output, r.metadata().config, params, hf_export_options(o, tokenizer));
    return output;
  }
  const CheckpointMetadata& m = r.metadata();
  CheckpointWriter w(output, m.state.iteration, m.config, o.layout);
  w.begin();
  for (int pp = 0; pp < o.layout.pp; ++pp)
    for (int tp = 0; tp < o.layout.tp; ++tp) w.write_rank(tp, pp, r.read_rank(o.layout, tp, pp));
  const std::string dir = w.commit(m.state);
  if (fs::exists(tokenizer)) copy_tokenizer_files(tokenizer, (fs::path(dir) / "tokenizer").string());
  return dir;
}

}  // namespace dlm::ckpt
