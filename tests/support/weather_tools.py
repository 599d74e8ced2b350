"""The weather tool the tests offer a model, in each variant a test needs (the variant's name says how it
differs): one owner for each schema."""

# The tool the chat and Ollama endpoints are given: described, a required city.
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}

# WEATHER in the Responses API's flat shape (no "function" wrapper).
WEATHER_RESPONSES = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}

# WEATHER without its description.
WEATHER_UNDESCRIBED = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}

# Named `weather`, an optional city, nothing else: the smallest tool.
WEATHER_UNREQUIRED = {
    "type": "function",
    "function": {"name": "weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}

# A closed schema: a required city and 1 to 7 days.
WEATHER_CLOSED_DAYS = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}

# A closed schema: a non-empty city, 1 to 7 days and a unit of two.
WEATHER_CLOSED_DAYS_UNIT = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "minLength": 1},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}

# A closed schema whose city has at most 6 characters, and 1 to 7 days: a forced call ends soon.
WEATHER_CITY_6 = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 6},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}

# A closed schema whose city has at most 8 characters, and up to 7 days.
WEATHER_CITY_8 = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 8}, "days": {"type": "integer", "maximum": 7}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}

# A closed schema of two required fields: a city of two and 0 to 48 hours.
WEATHER_PARIS_ROME_HOURS = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "enum": ["Paris", "Rome"]},
                "hours": {"type": "integer", "minimum": 0, "maximum": 48},
            },  # fmt: skip
            "required": ["city", "hours"],
            "additionalProperties": False,
        },
    },
}

# Described down to its city, with a unit: what templates render of a tool's descriptions.
WEATHER_DESCRIBED_UNIT = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city, now.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
