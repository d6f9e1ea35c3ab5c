"""The `paper-recon` preset reproduces the ReconScore paper's settings and adds none of its own."""

from caprecon.run.config import RunConfig
from caprecon.run.roles import Roles


def test_paper_recon_leaves_guidance_to_the_pipeline(tiny_sd):
    # The base Z-Image is guided; the paper names no scale, so the pipeline's default must apply.
    # Only the model is swapped for a tiny local pipeline: steps, text length and guidance come
    # from the preset and the registry entry, as in a real run.
    config = RunConfig.build(preset="paper-recon", generator_options={"model": str(tiny_sd)})
    generator = Roles(config).generator
    generator.pipeline  # loaded, so the call options are filtered by what it accepts
    assert generator.guidance is None and generator.describe()["guidance"] is None
    call = generator._call_options()
    assert "guidance_scale" not in call
    assert call["num_inference_steps"] == 28

    chosen = RunConfig.build(preset="paper-recon", generator_options={"model": str(tiny_sd), "guidance": 4.0})
    chosen_generator = Roles(chosen).generator
    chosen_generator.pipeline
    assert chosen_generator._call_options()["guidance_scale"] == 4.0
