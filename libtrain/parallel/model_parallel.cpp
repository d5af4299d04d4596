// ParallelModel: a rank's chunks of a TP/PP replica, and the trainer's view of them.
#include "dlm/train/model_parallel.h"

#include <fmt/format.h>

#include "dlm/common/error.h"
#include "dlm/train/model_adapters.h"
#include "dlm/train/pipeline_schedule.h"

namespace dlm::train {

int virtual_stages_for(const ckpt::ModelConfig& config, int pipeline, int layers_per_virtual_stage) {
  if (layers_per_virtual_stage <= 0) return 1;
  if (pipeline < 2)
    fail("--num-layers-per-virtual-pipeline-stage needs --pipeline-model-parallel-size of at least 2 (as in Megatron)");
  if (config.num_layers % (pipeline * layers_per_virtual_stage) != 0)
    fail(fmt::format("--num-layers-per-virtual-pipeline-stage {}: --num-layers {} is not a multiple of it times "
                     "--pipeline-model-parallel-size {}", layers_per_virtual_stage, config.num_layers, pipeline));
  return config.num_layers / (pipeline * layers_per_virtual_stage);
}

ParallelModel::ParallelModel(const ckpt::ModelConfig& config, Backend& backend, ProcessGroups& groups,
                             ModelParallelOptions options)
    : groups_(groups), options_(std::move(options)) {
  const int P = groups_.config.pipeline, V = options_.virtual_stages;
  if (V < 1) fail(fmt::format("model parallel: {} virtual pipeline stages", V));
  if (V > 1 && P < 2) fail("interleaved pipelines need --pipeline-model-parallel-size of at least 2 (as in Megatron)");
  layout_.tp = groups_.config.tensor;
  layout_.pp = P * V;
  layout_.dp = groups_.config.data;
  layout_.ep = groups_.config.expert;
  layout_.layers_per_stage = options_.layers_per_stage;
  layout_.validate(config);
  for (int v = 0; v < V; ++v) {
    ModelShard shard;
    shard.layout = layout_;
    shard.stage = v * P + groups_.coords.pipeline;
    shard.tensor = layout_.tp > 1 ? groups_.tensor.get() : nullptr;
    shard.sequence_parallel = options_.sequence_parallel;
    shard.expert = layout_.ep > 1 ? groups_.expert.get() : nullptr;
    chunks_.push_back(std::make_unique<Model>(config, backend, shard));
  }
  tied_across_stages_ = config.tie_word_embeddings && P > 1;
}

// Megatron's embedding group: the first and the last pipeline rank keep their copies of a tied embedding
// equal by summing their gradients. Made on first use, which every pipeline rank reaches together (the
// constructor stays free of collectives: dlm-train builds the model on rank 0 before the others).
Communicator* ParallelModel::embedding_group() {
  if (!tied_across_stages_) return nullptr;
  if (!embedding_group_made_) {
    const int r = groups_.coords.pipeline, P = groups_.config.pipeline;
    auto group = groups_.pipeline->split(r == 0 || r == P - 1 ? 0 : 1, r, "embedding group (first and last stage)");
    if (r == 0 || r == P - 1) embedding_group_ = std::move(group);
    embedding_group_made_ = true;
  }
  return embedding_group_.get();
}

ParallelModel::~ParallelModel() = default;

void ParallelModel::init(std::uint64_t seed) {
  for (auto& c : chunks_) c->init(seed);
}

std::vector<Parameter*> ParallelModel::parameters() {
  std::vector<Parameter*> out;
  for (auto& c : chunks_)
    for (auto& p : c->parameters()) out.push_back(&p);
  return out;
}

static Parameter* tied_embedding(ParallelModel& m) {
  for (Parameter* p : m.parameters())
    if (p->spec.name == "embedding.word_embeddings.weight") return p;
  fail("model parallel: the first or last stage holds no embedding");
}

namespace {

class TrainableParallel final : public TrainableModel {
 public:
  explicit TrainableParallel(ParallelModel& model)
      : model_(model) {
    std::size_t offset = 0;
    for (auto& c : model_.chunks()) {
      chunks_.push_back(c.get());
      offsets_.push_back(offset);
      offset += c->parameters().size();
    }
    for (Parameter* p : model_.parameters()) {
      refs_.push_back(host_param_ref(model_.chunks().front()->backend(), *p));
      refs_.back().expert_parallel = model_.layout().ep > 1 && p->spec.name.find(".mlp.experts.") != std::string::npos;
    }
  }
  std::vector<ParamRef> parameters() override { return refs_; }
  void zero_grad() override {
    for (Model* c : chunks_) c->zero_grad();
  }
  double forward_backward(const ModelBatch& batch) override { return forward_backward_all(std::span(&batch, 1)); }
  double forward_loss(const ModelBatch& batch) override { return forward_loss_all(std::span(&batch, 1)); }
  double forward_backward_all(std::span<const ModelBatch> batches) override {
    std::function<void(int, std::size_t)> chunk_hook;
    if (hook_)
      chunk_hook = [this](int chunk, std::size_t p) {
        // Gradients other ranks still add to wait for finish_gradients().
        if (!shared(chunk, p)) hook_(offsets_[static_cast<std::size_t>(chunk)] + p);
      };
    return pipeline_forward_backward(chunks_, *model_.groups().pipeline, batches, nullptr, chunk_hook);
  }
  void set_gradient_ready_hook(std::function<void(std::size_t)> hook) override { hook_ = std::move(hook); }
  double forward_loss_all(std::span<const ModelBatch> batches) override {
    return pipeline_forward_only(chunks_, *model_.groups().pipeline, batches);
  }
  void finish_gradients() override {
    for (Model* c : chunks_) c->reduce_shared_gradients();
    if (Communicator* g = model_.embedding_group()) g->all_reduce(f32_elements(tied_embedding(model_)->grad));
    if (hook_)
      for (std::size_t c = 0; c < chunks_.size(); ++c)
        for (std::size_t p = 0; p < chunks_[c]->parameters().size(); ++p)
          if (shared(static_cast<int>(c), p)) hook_(offsets_[c] + p);
  }
  MoeStepSums take_moe_sums() override {
    MoeStepSums all;
    for (Model* c : chunks_) {
      MoeStepSums s = c->take_moe_sums();
      if (all.values.empty()) {
        all = std::move(s);
        continue;
      }
      for (std::size_t i = 0; i < s.values.size(); ++i) all.values[i] += s.values[i];
    }
    return all;
  }
  Communicator* expert_data_parallel() override { return model_.groups().expert_data.get(); }
  Communicator* expert_parallel() override { return model_.groups().expert.get(); }
  bool reports() const override { return model_.groups().coords.tensor == 0 && model_.groups().coords.pipeline == 0; }
  void sum_over_model(std::span<double> values) override {
    if (model_.groups().config.tensor > 1) model_.groups().tensor->all_reduce(values);
    if (model_.groups().config.pipeline > 1) model_.groups().pipeline->all_reduce(values);
  }

 private:
  // Summed over the tensor group or the embedding group in finish_gradients().
  bool shared(int chunk, std::size_t p) const {
    const Model& m = *chunks_[static_cast<std::size_t>(chunk)];
    const Parameter& param = m.parameters()[p];
    return m.gradient_shared_over_tensor_group(param) ||
           (model_.tied_across_stages() && param.spec.name == "embedding.word_embeddings.weight");
  }

  ParallelModel& model_;
  std::vector<Model*> chunks_;
  std::vector<std::size_t> offsets_;  // index of each chunk's first parameter in parameters()
  std::vector<ParamRef> refs_;
  std::function<void(std::size_t)> hook_;
};

}  // namespace

std::unique_ptr<TrainableModel> make_trainable_model(ParallelModel& model) {
  return std::make_unique<TrainableParallel>(model);
}

}  // namespace dlm::train
