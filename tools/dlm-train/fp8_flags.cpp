#include "fp8_flags.h"

#include "flag_checks.h"

namespace po = boost::program_options;

namespace dlm::tools {

void add_fp8_flags(po::options_description& group, Fp8Flags& f) {
  group.add_options()
      ("fp8-format", po::value(&f.format), "e4m3 | hybrid: the layers' linear GEMMs in FP8 (--device cuda): e4m3 "
       "activations and weights, gradients e4m3 or e5m2 (hybrid); master weights, optimizer, embedding and output "
       "layer unchanged")
      ("fp8-recipe", po::value(&f.recipe)->default_value(f.recipe), "tensorwise (each cast scaled by its tensor's "
       "own amax) | delayed (scales from an amax history)")
      ("fp8-margin", po::value(&f.margin)->default_value(f.margin), "scales divided by 2^margin")
      ("fp8-amax-history-len", po::value(&f.amax_history_len)->default_value(f.amax_history_len),
       "delayed: amaxes kept per tensor")
      ("fp8-amax-compute-algo", po::value(&f.amax_algo)->default_value(f.amax_algo),
       "delayed: max (of the history) | most_recent")
      ("first-last-layers-bf16", po::bool_switch(&f.first_last_layers_bf16),
       "keep the first and last layers' GEMMs in bf16 (tensorwise; as Megatron, not with delayed)")
      ("num-layers-at-start-in-bf16", po::value(&f.layers_at_start)->default_value(f.layers_at_start),
       "with --first-last-layers-bf16: layers at the start kept in bf16")
      ("num-layers-at-end-in-bf16", po::value(&f.layers_at_end)->default_value(f.layers_at_end),
       "with --first-last-layers-bf16: layers at the end kept in bf16");
}

train::Fp8Options apply_fp8_flags(const Fp8Flags& f) {
  // Checked with or without --fp8-format, as every other flag's range is: a bad value is a usage error at once.
  in_range("fp8-margin", f.margin, 0, 64);
  in_range("fp8-amax-history-len", f.amax_history_len, 1, 1 << 20);
  in_range("num-layers-at-start-in-bf16", f.layers_at_start, 0, 1 << 20);
  in_range("num-layers-at-end-in-bf16", f.layers_at_end, 0, 1 << 20);
  train::Fp8Options o;
  o.enabled = !f.format.empty();
  if (o.enabled) o.format = train::parse_fp8_format(f.format);
  o.recipe = train::parse_fp8_recipe(f.recipe);
  o.amax_algo = train::parse_fp8_amax_algo(f.amax_algo);
  o.margin = f.margin, o.amax_history_len = f.amax_history_len;
  o.first_last_layers_bf16 = f.first_last_layers_bf16;
  o.layers_at_start_in_bf16 = f.layers_at_start, o.layers_at_end_in_bf16 = f.layers_at_end;
  return o;
}

}  // namespace dlm::tools
