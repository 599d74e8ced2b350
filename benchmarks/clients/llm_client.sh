#!/bin/sh
# simonw's llm against `edgelm serve`: a completion model and a chat model, declared in extra-openai-models.yaml
# of a throwaway LLM_USER_PATH (llm's "OpenAI-compatible models"). Needs: pip install llm.
# Run a server first, e.g. `edgelm serve PACKAGE --model-name edgelm`, then `sh benchmarks/clients/llm_client.sh`
# (EDGELM_URL and EDGELM_MODEL override the defaults).
set -e
URL=${EDGELM_URL:-http://127.0.0.1:8000/v1}
MODEL=${EDGELM_MODEL:-edgelm}
LLM_USER_PATH=$(mktemp -d)
export LLM_USER_PATH
cat > "$LLM_USER_PATH/extra-openai-models.yaml" <<YAML
- model_id: edgelm-chat
  model_name: $MODEL
  api_base: "$URL"
- model_id: edgelm-completion
  model_name: $MODEL
  api_base: "$URL"
  completion: true
YAML
echo "llm -m edgelm-completion:"; llm -m edgelm-completion "The capital of France is" -o max_tokens 8; echo
echo "llm -m edgelm-chat:"; llm -m edgelm-chat "Say hello." -o max_tokens 16; echo
echo "llm -m edgelm-chat --no-stream:"; llm -m edgelm-chat --no-stream "Say hello." -o max_tokens 16; echo
echo "llm chat (two turns):"; printf 'Hi\nAnd again\n' | llm chat -m edgelm-chat -o max_tokens 8
rm -rf "$LLM_USER_PATH"
