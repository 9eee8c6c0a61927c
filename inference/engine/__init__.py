"""The serving engine: `Scheduler` (pure Python), `ModelRunner` (the only tensor code), `Sampler`,
`Engine` (the step loop), `AsyncEngine` (asyncio front). Import the submodules you need: this
package imports nothing, so the scheduler and its tests stay free of torch."""
