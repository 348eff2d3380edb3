# TGL001 FP: `self.critic_optim` is tianshou's Algorithm.Optimizer wrapper (other file);
# its step(loss) does zero_grad(); loss.backward(); optim.step() itself.
import torch


class CQL(torch.nn.Module):
    def __init__(self, critic, critic_optim_factory):
        super().__init__()
        self.critic = critic
        self.critic_optim = self._create_optimizer(self.critic, critic_optim_factory)
        self.cql_log_alpha = torch.zeros(1, requires_grad=True)
        self.cql_alpha_optim = torch.optim.Adam([self.cql_log_alpha], lr=1e-3)

    def _update_with_batch(self, obs, target):
        q = self.critic(obs)
        critic_loss = torch.nn.functional.mse_loss(q, target)
        cql_loss = self.cql_log_alpha.exp() * q.mean()
        self.cql_alpha_optim.zero_grad()
        cql_loss.backward(retain_graph=True)
        self.cql_alpha_optim.step()
        self.critic_optim.step(critic_loss + cql_loss)   # TGL001 reported: the wrapper zeroes first
