#!/usr/bin/env python3
"""Export small Hugging Face transformers to ONNX through both `torch.onnx.export` paths.

Usage (from the repository root, with the packages of requirements.txt beside this script
installed — PyPI's torch is large, so CI does not run this; the files it writes are
committed):

    python examples/exporters/export.py [MODEL ...]     # default: every model

Models, each built from a tiny config object with random weights (fixed seed, nothing is
downloaded), run in eval mode (no dropout), input `input_ids` i64 [2, 16] (static shapes),
output `logits` f32 [2, 16, V]:

    gpt2    GPT2LMHeadModel: 2 layers, d 64, 4 heads, vocab 256, learned positions,
            LayerNorm, tanh-GELU; `tie_word_embeddings=False` (the LM head has its own
            weight) until ppcc trains weights shared across stages
    llama   LlamaForCausalLM: 2 layers, d 64, 4 query heads over 2 key/value heads
            (grouped-query attention), RMSNorm, rotary embeddings, SwiGLU MLP, vocab 256
    bert    BertForMaskedLM: 2 layers, d 64, 4 heads, vocab 256, post-LayerNorm encoder,
            bidirectional attention, erf-GELU, MLM head; untied decoder weight
    gpt2_tied  gpt2 with its LM head tied to the token embedding (one initializer read by
            the embedding Gather and the LM-head MatMul): ppcc evaluates it and trains it
            on one device; a pipeline that puts the two users on different stages waits
            for ppcc's support of weights shared across stages

Paths: `ts` is the TorchScript-based exporter (`dynamo=False`, opset 17), `dynamo` the
torch.export-based one (`dynamo=True`, opset 18). Attention runs the "eager" implementation
(plain matmuls and softmax, as the models are written) so that both paths see the same code.
Every parameter gets random noise on top of its initial value (see `randomize`); the dynamo
path runs without its ONNX optimizer (which folds masks, rotary tables and position
embeddings into float initializers, i.e. into parameters), and the buffers it writes as
initializers become `Constant` nodes and its debug metadata is dropped (see `tidy_dynamo`).

For each MODEL and PATH it writes, next to this script:

    MODEL_PATH.onnx      the exported model
    MODEL_PATH_io.npz    `input_ids` and onnxruntime's `logits` (graph optimisations off)
    MODEL_train.npz      `input_ids` [8, 16] and `labels` [8, 16] (four batches of 2 rows):
                         next-token labels for the causal LMs, the tokens themselves for BERT

and prints what onnxruntime's logits differ from torch's by. A path that fails prints why
and writes nothing for it.
"""

import os
import sys
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import torch
import transformers

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from gen_examples import write_npz  # noqa: E402  (deterministic npz writer)

BATCH, SEQ, VOCAB = 2, 16, 256
TRAIN_ROWS = 4 * BATCH


def gpt2():
    cfg = transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=32, n_embd=64, n_layer=2, n_head=4,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=False,
        attn_implementation="eager", use_cache=False)
    return transformers.GPT2LMHeadModel(cfg), True


def llama():
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
        tie_word_embeddings=False, attn_implementation="eager", use_cache=False)
    return transformers.LlamaForCausalLM(cfg), True


def gpt2_tied():
    cfg = transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=32, n_embd=64, n_layer=2, n_head=4,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=True,
        attn_implementation="eager", use_cache=False)
    return transformers.GPT2LMHeadModel(cfg), True


def bert():
    cfg = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, max_position_embeddings=32, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, tie_word_embeddings=False,
        attn_implementation="eager")
    return transformers.BertForMaskedLM(cfg), False


# Exported by the TorchScript path without constant folding, which would fold the tied LM
# head's Transpose of the embedding into an initializer of its own (untying it).
UNFOLDED = {"gpt2_tied"}

MODELS = {"gpt2": gpt2, "llama": llama, "bert": bert, "gpt2_tied": gpt2_tied}


class Logits(torch.nn.Module):
    """The model with `input_ids` in and only the logits out.

    The all-ones attention mask is made inside: without one, transformers looks for packed
    sequences in the position ids with `torch.diff`, which the TorchScript exporter lacks.
    """

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        mask = torch.ones_like(input_ids)
        return self.model(input_ids=input_ids, attention_mask=mask, return_dict=True).logits


def randomize(model):
    """Random values for every parameter, also those initialised to ones and zeros (norm
    scales, biases): the TorchScript exporter merges initializers with equal values into
    one, which would tie, e.g., every LayerNorm's weight together in training."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))


def tidy_dynamo(path, model):
    """ONNX has no non-trainable initializers and ppcc trains every float initializer, so
    the model's buffers (e.g. Llama's rotary `inv_freq`) become `Constant` nodes. The
    nodes' debug metadata (Python stack traces with this machine's paths, FX node text:
    half of the file) is dropped, so the file does not depend on where the script ran."""
    m = onnx.load(path)
    for n in m.graph.node:
        del n.metadata_props[:]
    names = {f"model.{n}" for n, _ in model.named_buffers()} | {n for n, _ in model.named_buffers()}
    keep, consts = [], []
    for t in m.graph.initializer:
        if t.name in names:
            consts.append(onnx.helper.make_node("Constant", [], [t.name], value=t,
                                                name=f"buffer:{t.name}"))
        else:
            keep.append(t)
    del m.graph.initializer[:]
    m.graph.initializer.extend(keep)
    nodes = consts + list(m.graph.node)
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    onnx.save(m, path)


def export(wrapper, ids, path, dynamo, fold):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            prog = torch.onnx.export(wrapper, (ids,), dynamo=True, opset_version=18,
                                     input_names=["input_ids"], output_names=["logits"],
                                     external_data=False, optimize=False)
            prog.save(path, external_data=False)
            tidy_dynamo(path, wrapper.model)
        else:
            torch.onnx.export(wrapper, (ids,), path, dynamo=False, opset_version=17,
                              input_names=["input_ids"], output_names=["logits"],
                              do_constant_folding=fold)
    model = onnx.load(path)
    onnx.checker.check_model(model, full_check=True)


def ort_logits(path, ids):
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    return sess.run(["logits"], {"input_ids": ids})[0]


def train_data(seed, causal):
    """Learnable sequences: each row is an arithmetic progression mod VOCAB."""
    rng = np.random.default_rng(seed)
    start = rng.integers(0, VOCAB, size=(TRAIN_ROWS, 1), dtype=np.int64)
    stride = rng.integers(1, 8, size=(TRAIN_ROWS, 1), dtype=np.int64)
    pos = np.arange(SEQ + 1, dtype=np.int64)[None, :]
    seq = (start + stride * pos) % VOCAB
    ids = seq[:, :SEQ]
    labels = seq[:, 1:] if causal else ids
    return {"input_ids": np.ascontiguousarray(ids), "labels": np.ascontiguousarray(labels)}


def main(names):
    for name in names:
        i = list(MODELS).index(name)  # the seeds do not depend on which models are asked for
        torch.manual_seed(100 + i)
        model, causal = MODELS[name]()
        randomize(model)
        model.eval()
        wrapper = Logits(model).eval()
        rng = np.random.default_rng(300 + i)
        ids = rng.integers(0, VOCAB, size=(BATCH, SEQ), dtype=np.int64)
        with torch.no_grad():
            want = wrapper(torch.from_numpy(ids)).numpy()
        write_npz(os.path.join(HERE, f"{name}_train.npz"), train_data(400 + i, causal))
        for path_name, dynamo in [("ts", False), ("dynamo", True)]:
            path = os.path.join(HERE, f"{name}_{path_name}.onnx")
            try:
                export(wrapper, torch.from_numpy(ids), path, dynamo, fold=name not in UNFOLDED)
            except Exception as e:  # report and go on with the other path / model
                print(f"{name} {path_name}: export failed: {type(e).__name__}: {e}")
                continue
            got = ort_logits(path, ids)
            write_npz(os.path.join(HERE, f"{name}_{path_name}_io.npz"),
                      {"input_ids": ids, "logits": got})
            m = onnx.load(path)
            ops = sorted({n.op_type for n in m.graph.node})
            err = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
            print(f"{name} {path_name}: {len(m.graph.node)} nodes, {os.path.getsize(path)} "
                  f"bytes, ort vs torch {err:.2e}, ops: {' '.join(ops)}")


if __name__ == "__main__":
    main(sys.argv[1:] or list(MODELS))
