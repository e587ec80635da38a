"""The engine's HTTP front end: the aiohttp server (`server`, run as `python -m reference_engine.server`), the
OpenAI and TGI protocols (`openai_api`, `tgi_api`) and what they share (`generation`), detokenisation with
stop strings, Prometheus metrics, and the handle on the engine the handlers use (`request_streams`): the
engine in this process (`async_engine`) or in an engine-core process of its own (`engine_client`). It imports
the engine core; the core never imports it."""
