"""Config dicts of block-drafter checkpoints, for ops.models.tiny.build_block_drafter_checkpoint."""

DFLASH = {
    "architectures": ["DFlashDraftModel"],
    "model_type": "qwen3",
    "block_size": 8,
    "dflash_config": {"mask_token_id": 3, "target_layer_ids": [1, 5]},
}
DSPARK = {
    "architectures": ["Lfm2DSparkDraftModel"],
    "model_type": "lfm2",
    "markov_rank": 16,
    "dflash_config": {"mask_token_id": 3, "target_layer_ids": [1]},
}
MUSE = {"architectures": ["MuseGlimmerAssistantModel"], "model_type": "muse_glimmer_assistant"}
