"""OpenAI's API as edgelm serves it: each endpoint's body (completions.py, chat.py, responses_api.py), the request
fields and their checks (requests.py, schema.py, fields.py, chat_requests.py), structured output and tool calls
(structured.py, tool_calls.py), and the response shapes (completion_answers.py, chat_answers.py, responses_answers.py).
The serving around them (the request pipeline, jobs, the queue, middleware) is the server package's."""
