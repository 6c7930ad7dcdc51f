"""Chat notifications: the webhook outbox, its sender, and the Slack, Lark and JSON formats."""
