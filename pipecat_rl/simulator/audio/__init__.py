"""Audio mode: the call carried as paced speech (Whisper/Piper offline, Deepgram/Cartesia keyed).

`episode` wires one audio episode (agent speech slots, persona ear and mouth), `transport` the
paced 20 ms call and the caller-side heard-gap meter, `channel` the seeded perturbations,
`services` the speech services.
"""
