"""Real models with random weights, built from configs (nothing is downloaded)."""

from __future__ import annotations

import torch


def build(name: str):
    """(model in eval mode, example inputs as a tuple)."""
    torch.manual_seed(0)
    if name == "resnet18":
        import torchvision

        model, inputs = torchvision.models.resnet18(weights=None), (torch.randn(2, 3, 64, 64),)
    elif name == "mobilenet_v3_small":
        import torchvision

        model, inputs = torchvision.models.mobilenet_v3_small(weights=None), (torch.randn(2, 3, 64, 64),)
    elif name == "vit_tiny_patch16_224":
        import timm

        model, inputs = timm.create_model("vit_tiny_patch16_224", pretrained=False), (torch.randn(1, 3, 224, 224),)
    elif name == "convnext_atto":
        import timm

        model, inputs = timm.create_model("convnext_atto", pretrained=False), (torch.randn(2, 3, 64, 64),)
    elif name == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(n_layer=4, n_embd=128, n_head=4, vocab_size=1000, n_positions=128,
                            bos_token_id=0, eos_token_id=0)
        model, inputs = GPT2LMHeadModel(config), (torch.randint(0, 1000, (2, 16)),)
    elif name == "bert":
        from transformers import BertConfig, BertModel

        config = BertConfig(num_hidden_layers=4, hidden_size=128, num_attention_heads=4,
                            intermediate_size=256, vocab_size=1000)
        model, inputs = BertModel(config), (torch.randint(0, 1000, (2, 16)),)
    elif name == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                             intermediate_size=128, vocab_size=1000)
        model, inputs = LlamaForCausalLM(config), (torch.randint(0, 1000, (2, 16)),)
    else:
        raise ValueError(name)
    return model.eval(), inputs


def tensors_of(output):
    """The tensors of a model output (tensor, tuple, ModelOutput), in order."""
    if isinstance(output, torch.Tensor):
        return [output]
    values = output.values() if hasattr(output, "values") else output
    return [v for v in values if isinstance(v, torch.Tensor)]
