// dlm-ckpt convert: HF <-> native, and native resharding rank by rank.
#include <filesystem>

#include <fmt/format.h>

#include "dlm/ckpt/megatron.h"
#include "dlm/ckpt/tools.h"
#include "dlm/common/error.h"

namespace dlm::ckpt {

namespace fs = std::filesystem;

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
  if (o.from == CheckpointKind::kMegatron) {
    MegatronCheckpoint m = load_megatron(input);
    if (o.to == CheckpointKind::kHuggingFace) {
      export_hf_folder(output, m.config, m.tensors, {.dtype = o.dtype, .tokenizer_dir = o.tokenizer_dir});
      return output;
    }
    if (o.to != CheckpointKind::kNative) fail("convert --from megatron writes native or hf");
    const std::string dir = save_checkpoint(output, m.config, o.layout, {std::move(m.tensors), {}, {}}, m.state);
    if (!o.tokenizer_dir.empty()) copy_tokenizer_files(o.tokenizer_dir, (fs::path(dir) / "tokenizer").string());
    return dir;
  }
  if (o.from == CheckpointKind::kHuggingFace) {
    HfModel m = load_hf_folder(input, o.make_vocab_size_divisible_by);
    if (o.to == CheckpointKind::kHuggingFace) {
      export_hf_folder(output, m.config, m.tensors, {.dtype = o.dtype, .tokenizer_dir = o.tokenizer_dir.empty() ? input : o.tokenizer_dir});
      return output;
    }
    const std::string dir = save_checkpoint(output, m.config, o.layout, {std::move(m.tensors), {}, {}}, {});
    copy_tokenizer_files(o.tokenizer_dir.empty() ? input : o.tokenizer_dir, (fs::path(dir) / "tokenizer").string());
    return dir;
  }
  CheckpointReader r(input);
  const std::string tokenizer = o.tokenizer_dir.empty() ? (fs::path(r.dir()) / "tokenizer").string() : o.tokenizer_dir;
  if (o.to == CheckpointKind::kHuggingFace) {
    export_hf_folder(output, r.metadata().config, r.read_global(false).params, {.dtype = o.dtype, .tokenizer_dir = tokenizer});
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
