// What dlm-ckpt does, as library calls: convert between native, Hugging Face and Megatron checkpoints (and
// between parallel layouts), validate one, compare two, describe one.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dlm/ckpt/checkpoint.h"
#include "dlm/ckpt/hf.h"
#include "dlm/ckpt/megatron_export.h"

namespace dlm::ckpt {

enum class CheckpointKind { kNative, kHuggingFace, kMegatron };
// kHuggingFace when the folder has config.json, kNative when it has metadata.json or `latest`,
// kMegatron for a Megatron legacy root or iteration folder (megatron.h).
CheckpointKind detect_kind(const std::string& path);

struct ConvertOptions {
  CheckpointKind from = CheckpointKind::kHuggingFace, to = CheckpointKind::kNative;
  ParallelLayout layout{};                      // native output
  TensorDType dtype = TensorDType::kBFloat16;   // HF output (as Megatron's converter writes)
  int make_vocab_size_divisible_by = 128;       // HF input
  std::string tokenizer_dir{};                  // HF output: where tokenizer files come from ("" = the input's)
  std::uint64_t max_shard_bytes = 5ull << 30;   // HF output: shard cap (HfExportOptions)
  int num_shards = 0;                           // HF output: > 0 overrides max_shard_bytes
  MegatronExportOptions megatron{};             // Megatron output: target TP/PP (megatron_export.h)
};
// "5GB" (10^9), "500MiB" (2^20), "123" bytes; K/M/G/T with B or iB. False when it is none of these.
bool parse_byte_size(std::string_view text, std::uint64_t& bytes);
// Megatron output (megatron_export.h) is written from the whole model of any input, with the native
// input's training state (iteration, consumed samples) or the Megatron input's.
// Megatron input (megatron.h) is merged to the whole model, then written like HF input, with its training
// state (iteration, consumed samples, args).
// native -> native reshards rank by rank (each target rank reads only its hyperslabs and writes its own
// file); HF input goes through the whole model. Native output keeps the input's training state, and
// tokenizer files travel in the checkpoint folder's tokenizer/ subfolder.
std::string convert_checkpoint(const std::string& input, const std::string& output, const ConvertOptions& options);

// The model config and global fp32 weights of either kind.
HfModel load_any(const std::string& path, int make_vocab_size_divisible_by = 128);

struct Report {
  std::vector<std::string> lines;   // what was checked, one line each
  std::vector<std::string> errors;  // what failed, one line each
  bool ok() const { return errors.empty(); }
};
// Native: structure, every global tensor covered exactly once by slices, shapes against the config,
// checksums of every dataset, NaN/Inf in every tensor, model.h5 opens. HF: config, safetensors headers,
// the tensor mapping, NaN/Inf.
Report validate_checkpoint(const std::string& path);
// NaN and Inf elements of a tensor; refuse_non_finite throws dlm::Error at `where` naming the first tensor
// that has any (a conversion never copies weights validate would flag).
std::int64_t count_non_finite(std::span<const float> values);
void refuse_non_finite(const TensorSet& tensors, const std::string& where);
// Tensor-by-tensor: max |a - b| and whether |a - b| <= atol + rtol * |b| everywhere.
Report compare_checkpoints(const std::string& a, const std::string& b, double rtol, double atol);
// Tensors, sizes, layout, training state.
std::string inspect_checkpoint(const std::string& path);

// The Megatron branches of validate_checkpoint and inspect_checkpoint.
void validate_megatron(const std::string& path, Report& r);
std::string inspect_megatron(const std::string& path);

}  // namespace dlm::ckpt
